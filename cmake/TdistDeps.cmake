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

# CUDA runtime and NCCL: looked up under CUDAToolkit_ROOT, then /usr/local/cuda.
# Only headers and libraries are needed for the library itself (no nvcc).
set(TDIST_HAVE_NCCL OFF)
if(NOT TDIST_WITH_NCCL STREQUAL "OFF")
  set(_cuda_hints ${CUDAToolkit_ROOT} $ENV{CUDAToolkit_ROOT} $ENV{CUDA_HOME} /usr/local/cuda)
  find_path(TDIST_CUDA_INCLUDE cuda_runtime_api.h HINTS ${_cuda_hints} PATH_SUFFIXES include)
  find_path(TDIST_NCCL_INCLUDE nccl.h HINTS ${_cuda_hints} $ENV{NCCL_HOME} PATH_SUFFIXES include)
  find_library(TDIST_CUDART_LIB cudart HINTS ${_cuda_hints} PATH_SUFFIXES lib64 lib)
  find_library(TDIST_NCCL_LIB nccl HINTS ${_cuda_hints} $ENV{NCCL_HOME} PATH_SUFFIXES lib64 lib)
  if(TDIST_CUDA_INCLUDE AND TDIST_NCCL_INCLUDE AND TDIST_CUDART_LIB AND TDIST_NCCL_LIB)
    set(TDIST_HAVE_NCCL ON)
    # Imported, so the installed package can recreate it (tdistConfig.cmake).
    add_library(tdist_cuda INTERFACE IMPORTED GLOBAL)
    set_target_properties(tdist_cuda PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${TDIST_CUDA_INCLUDE};${TDIST_NCCL_INCLUDE}"
      INTERFACE_LINK_LIBRARIES "${TDIST_NCCL_LIB};${TDIST_CUDART_LIB}")
    list(APPEND TDIST_PRIVATE_LIBS tdist_cuda)
    list(APPEND TDIST_PRIVATE_DEFS TDIST_HAVE_NCCL)
    message(STATUS "NCCL backend: nccl.h in ${TDIST_NCCL_INCLUDE}, ${TDIST_NCCL_LIB}")
  elseif(TDIST_WITH_NCCL STREQUAL "ON")
    message(FATAL_ERROR "TDIST_WITH_NCCL=ON but CUDA/NCCL were not found under "
                        "${_cuda_hints}; set CUDAToolkit_ROOT")
  else()
    message(STATUS "CUDA/NCCL not found: building without the NCCL backend")
  endif()
endif()

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
