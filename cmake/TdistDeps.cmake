# Finds tdist's dependencies. Each missing one stops the configure step with
# the Debian package that provides it.
find_package(Threads REQUIRED)
find_package(PkgConfig)

set(TDIST_PRIVATE_LIBS "")
set(TDIST_PRIVATE_DEFS "")
set(TDIST_PC_REQUIRES "libuv")

# libuv: the progress thread's and the store server's event loop.
if(PkgConfig_FOUND)
  pkg_check_modules(LIBUV IMPORTED_TARGET libuv>=1.40)
endif()
if(NOT LIBUV_FOUND)
  message(FATAL_ERROR "libuv (>= 1.40) not found. On Debian/Ubuntu: apt-get install libuv1-dev pkg-config")
endif()
list(APPEND TDIST_PRIVATE_LIBS PkgConfig::LIBUV)

# libcurl and json-c: the etcd store (src/store/etcd*.c) speaks HTTP/JSON to
# etcd's gRPC gateway.
if(PkgConfig_FOUND)
  pkg_check_modules(LIBCURL IMPORTED_TARGET libcurl>=7.68)
  pkg_check_modules(JSONC IMPORTED_TARGET json-c>=0.13)
endif()
if(NOT LIBCURL_FOUND)
  message(FATAL_ERROR "libcurl (>= 7.68) not found. On Debian/Ubuntu: apt-get install libcurl4-openssl-dev")
endif()
if(NOT JSONC_FOUND)
  message(FATAL_ERROR "json-c (>= 0.13) not found. On Debian/Ubuntu: apt-get install libjson-c-dev")
endif()
list(APPEND TDIST_PRIVATE_LIBS PkgConfig::LIBCURL PkgConfig::JSONC)
string(APPEND TDIST_PC_REQUIRES " libcurl json-c")

# jemalloc: a dedicated arena for the runtime's host allocations. Off under
# sanitizers, whose allocator must see every allocation.
set(TDIST_HAVE_JEMALLOC OFF)
if(NOT TDIST_WITH_JEMALLOC STREQUAL "OFF" AND NOT TDIST_ENABLE_ASAN AND NOT TDIST_ENABLE_TSAN)
  if(PkgConfig_FOUND)
    pkg_check_modules(JEMALLOC IMPORTED_TARGET jemalloc)
  endif()
  if(JEMALLOC_FOUND)
    set(TDIST_HAVE_JEMALLOC ON)
    list(APPEND TDIST_PRIVATE_LIBS PkgConfig::JEMALLOC)
    list(APPEND TDIST_PRIVATE_DEFS TDIST_HAVE_JEMALLOC)
    string(APPEND TDIST_PC_REQUIRES " jemalloc")
  elseif(TDIST_WITH_JEMALLOC STREQUAL "ON")
    message(FATAL_ERROR "jemalloc not found. On Debian/Ubuntu: apt-get install libjemalloc-dev")
  else()
    message(STATUS "jemalloc not found (apt-get install libjemalloc-dev); using malloc")
  endif()
endif()

# NCCL and the CUDA runtime: not build dependencies. The NCCL backend opens
# them with dlopen when a group asks for it (src/nccl/nccl_lib.c), so the
# library has no NEEDED entry for either and its package names no CUDA path.
# Only the GPU test programs (tests/gpu, bench/nccl) need a CUDA toolkit.
list(APPEND TDIST_PRIVATE_LIBS ${CMAKE_DL_LIBS})

# cmocka: the test framework.
if(TDIST_BUILD_TESTS)
  if(PkgConfig_FOUND)
    pkg_check_modules(CMOCKA IMPORTED_TARGET cmocka)
  endif()
  if(NOT CMOCKA_FOUND)
    message(FATAL_ERROR "cmocka not found. On Debian/Ubuntu: apt-get install libcmocka-dev "
                        "(or configure with -DTDIST_BUILD_TESTS=OFF)")
  endif()
endif()
