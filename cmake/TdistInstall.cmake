# Install rules: headers, both libraries, the CMake package (tdist::tdist) and
# tdist.pc for pkg-config.
include(CMakePackageConfigHelpers)

install(DIRECTORY include/tdist DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS tdist tdist_static EXPORT tdistTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The static library's private link dependencies are named in the export; the
# imported targets they refer to are recreated by tdistConfig.cmake.
install(EXPORT tdistTargets NAMESPACE tdist:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tdist)

configure_package_config_file(cmake/tdistConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/tdistConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tdist)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/tdistConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/tdistConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/tdistConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tdist)

# No CUDA or NCCL path: the NCCL backend opens them at run time. Libs.private:
# the dependencies' own link flags (cmake/TdistDeps.cmake says why they are not
# Requires.private), then threads and dl.
set(TDIST_PC_LIBS_PRIVATE ${TDIST_PC_DEPS_LIBS} -lpthread)
if(CMAKE_DL_LIBS)
  list(APPEND TDIST_PC_LIBS_PRIVATE -l${CMAKE_DL_LIBS})
endif()
list(REMOVE_DUPLICATES TDIST_PC_LIBS_PRIVATE)
string(REPLACE ";" " " TDIST_PC_LIBS_PRIVATE "${TDIST_PC_LIBS_PRIVATE}")
# Relocatable: the prefix is found from the .pc file's own directory
# (<prefix>/<libdir>/pkgconfig), so an install anywhere works.
string(REGEX REPLACE "[^/]+" ".." TDIST_PC_UP "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
configure_file(cmake/tdist.pc.in ${CMAKE_CURRENT_BINARY_DIR}/tdist.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/tdist.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
