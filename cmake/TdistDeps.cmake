# Finds tdist's dependencies. Each missing one stops the configure step with
# the Debian package that provides it.
find_package(Threads REQUIRED)
find_package(PkgConfig)

set(TDIST_PRIVATE_LIBS "")
set(TDIST_PRIVATE_DEFS "")

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

# What a static link of libtdist.a adds (tdist.pc's Libs.private): the flags
# pkg-config gave for linking each dependency's shared library (-luv, -lcurl,
# -ljson-c, with -L where they are not in a default folder). Not
# Requires.private: pkg-config resolves those for --cflags too, so every
# consumer, shared ones included, would need the three -dev packages, and for
# --static it would add libcurl's own private chain (Kerberos, LDAP, ...),
# which fails unless every one of those -dev packages is installed.
set(TDIST_PC_DEPS_LIBS "")
foreach(_dep LIBUV LIBCURL JSONC)
  list(APPEND TDIST_PC_DEPS_LIBS ${${_dep}_LDFLAGS})
endforeach()
list(REMOVE_DUPLICATES TDIST_PC_DEPS_LIBS)

# jemalloc: a dedicated arena for the runtime's host allocations, from a
# jemalloc private to libtdist (built here from Debian's source package:
# cmake/TdistJemalloc.cmake). Off under sanitizers and in the fuzz build:
# their allocator must see every allocation.
include(TdistJemalloc)
if(TDIST_HAVE_JEMALLOC)
  list(APPEND TDIST_PRIVATE_DEFS TDIST_HAVE_JEMALLOC)
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
