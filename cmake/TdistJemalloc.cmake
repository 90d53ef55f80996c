# TdistJemalloc.cmake - the runtime's allocator: a jemalloc private to libtdist.
#
# Why private: a shared jemalloc (Debian's libjemalloc.so.2) exports malloc,
# so linking it replaces the allocator of the whole process, and it uses
# initial-exec TLS, so libtdist.so could not be dlopened into a running
# process (Python's ctypes) without GLIBC_TUNABLES set before it started.
# This jemalloc is built from source by the project with
#   --with-jemalloc-prefix=tdist__je_  its API is tdist__je_mallocx, ...; it
#                                      defines no malloc/free at all and never
#                                      wraps glibc's __libc_* entry points;
#   --with-private-namespace=tdist__   its internal symbols are tdist__je_*:
#                                      every global symbol it defines is
#                                      tdist__ (tools/check_layers.py's rule);
#   --without-export                   every symbol has hidden visibility, so
#                                      libtdist.so exports none of them;
#   --disable-initial-exec-tls         the default (global-dynamic) TLS model:
#                                      dlopen works at any time;
# as a static, position-independent archive (lib/libjemalloc_pic.a) linked
# into libtdist.so and merged into libtdist.a (cmake/TdistMergeArchive.cmake).
# The same route as the Rust crate tikv-jemallocator's for libraries loaded
# with dlopen.
#
# Source: Debian's jemalloc source package, which scripts/deps.sh fetches with
# `apt-get source jemalloc` into third_party/jemalloc/src. It is configured and
# built once per build tree (ExternalProject: its stamps keep it from running
# again), the static PIC archive only: 28 s in all on an idle 2-core VM
# (17 s of configure and 47 s of compiling with the VM busy).
#
# In:  TDIST_WITH_JEMALLOC (AUTO|ON|OFF), TDIST_ENABLE_ASAN/TSAN, TDIST_BUILD_FUZZ.
# Out: TDIST_HAVE_JEMALLOC (ON/OFF); when ON, the imported target
#      tdist_jemalloc (archive + include directory, depends on the build) and
#      TDIST_JEMALLOC_ARCHIVE (the archive's path).
set(TDIST_JEMALLOC_SOURCE_DIR "${PROJECT_SOURCE_DIR}/third_party/jemalloc/src" CACHE PATH
    "Unpacked jemalloc source (scripts/deps.sh fetches Debian's: apt-get source jemalloc)")

set(TDIST_HAVE_JEMALLOC OFF)
if(NOT TDIST_WITH_JEMALLOC MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "TDIST_WITH_JEMALLOC must be AUTO, ON or OFF (is '${TDIST_WITH_JEMALLOC}')")
endif()
if(TDIST_WITH_JEMALLOC STREQUAL "OFF")
  return()
endif()
# Sanitizers: their allocator must see every allocation. The fuzz build links
# the library into an ASan target, which must see the parser's allocations too
# (and CI's fuzz pass is spared a jemalloc build).
if(TDIST_ENABLE_ASAN OR TDIST_ENABLE_TSAN OR TDIST_BUILD_FUZZ)
  message(STATUS "jemalloc: off in a sanitizer or fuzz build; the runtime uses malloc")
  return()
endif()
if(NOT EXISTS "${TDIST_JEMALLOC_SOURCE_DIR}/configure")
  set(_msg "jemalloc's source not found in ${TDIST_JEMALLOC_SOURCE_DIR}: run `bash scripts/deps.sh` "
           "(it fetches Debian's jemalloc source package) or set TDIST_JEMALLOC_SOURCE_DIR")
  if(TDIST_WITH_JEMALLOC STREQUAL "ON")
    message(FATAL_ERROR ${_msg})
  endif()
  message(STATUS ${_msg} "; the runtime uses malloc")
  return()
endif()

find_program(TDIST_MAKE NAMES gmake make)
if(NOT TDIST_MAKE)
  message(FATAL_ERROR "jemalloc's build needs make. On Debian/Ubuntu: apt-get install make "
                      "(or configure with -DTDIST_WITH_JEMALLOC=OFF)")
endif()
include(ExternalProject)

set(_je_bin "${CMAKE_BINARY_DIR}/jemalloc")
set(TDIST_JEMALLOC_ARCHIVE "${_je_bin}/lib/libjemalloc_pic.a")
# Page size: jemalloc aborts on a page larger than the one it was built for,
# so (as Debian's own build does) 4 KiB on x86, 64 KiB, the largest, elsewhere.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64|i[3-6]86)$")
  set(_je_lg_page 12)
else()
  set(_je_lg_page 16)
endif()
set(_je_configure
    "${TDIST_JEMALLOC_SOURCE_DIR}/configure"
    --with-jemalloc-prefix=tdist__je_ --with-private-namespace=tdist__
    --without-export --disable-initial-exec-tls
    --disable-shared --enable-static --disable-cxx --disable-doc
    # What the store's heap report reads (src/store/budget.c: stats.allocated).
    --enable-stats
    # The VERSION file of the release tarball (else jemalloc runs git describe
    # in the enclosing repository, ours).
    --with-version=VERSION
    --with-lg-page=${_je_lg_page} --with-lg-hugepage=21)
# Parallel build: make's jobserver under a Makefile generator, else the cores.
if(CMAKE_GENERATOR MATCHES "Makefiles")
  set(_je_make "$(MAKE)")
else()
  cmake_host_system_information(RESULT _je_jobs QUERY NUMBER_OF_LOGICAL_CORES)
  set(_je_make "${TDIST_MAKE}" -j${_je_jobs})
endif()
ExternalProject_Add(tdist_jemalloc_build
  SOURCE_DIR "${TDIST_JEMALLOC_SOURCE_DIR}"
  BINARY_DIR "${_je_bin}"
  PREFIX "${CMAKE_BINARY_DIR}/jemalloc-ep"
  # EXTRA_CFLAGS come after jemalloc's own -O3 -g3: -g1 keeps backtraces and
  # line tables but not the macro and variable tables that made the archive
  # 41 MB (2.8 MB with -g1).
  CONFIGURE_COMMAND ${CMAKE_COMMAND} -E env "CC=${CMAKE_C_COMPILER}" "EXTRA_CFLAGS=-g1" ${_je_configure}
  BUILD_COMMAND ${_je_make} lib/libjemalloc_pic.a
  INSTALL_COMMAND ""
  BUILD_BYPRODUCTS "${TDIST_JEMALLOC_ARCHIVE}"
  # Quiet: the output goes to jemalloc-ep/src/tdist_jemalloc_build-stamp/*.log,
  # shown only when a step fails.
  LOG_CONFIGURE ON LOG_BUILD ON LOG_OUTPUT_ON_FAILURE ON)

# A source fetched again by scripts/deps.sh (it rewrites DEBIAN_VERSION) is
# configured and built again.
if(EXISTS "${TDIST_JEMALLOC_SOURCE_DIR}/../DEBIAN_VERSION")
  ExternalProject_Add_StepDependencies(tdist_jemalloc_build configure
                                       "${TDIST_JEMALLOC_SOURCE_DIR}/../DEBIAN_VERSION")
endif()

# The generated header (include/jemalloc/jemalloc.h, tdist__je_* names) is
# made by the configure step; the folder must exist when CMake generates.
file(MAKE_DIRECTORY "${_je_bin}/include")
add_library(tdist_jemalloc STATIC IMPORTED)
set_target_properties(tdist_jemalloc PROPERTIES
  IMPORTED_LOCATION "${TDIST_JEMALLOC_ARCHIVE}"
  INTERFACE_INCLUDE_DIRECTORIES "${_je_bin}/include")
add_dependencies(tdist_jemalloc tdist_jemalloc_build)
set(TDIST_HAVE_JEMALLOC ON)
set(_je_ver "?")
if(EXISTS "${TDIST_JEMALLOC_SOURCE_DIR}/../DEBIAN_VERSION")
  file(STRINGS "${TDIST_JEMALLOC_SOURCE_DIR}/../DEBIAN_VERSION" _je_ver LIMIT_COUNT 1)
endif()
message(STATUS "jemalloc: private static build of ${TDIST_JEMALLOC_SOURCE_DIR} (Debian ${_je_ver})")
