# The CMake package (docs/building.md "Using moecheck from another project"): `cmake --install`
# puts the libraries, their headers (include/moecheck/<folder>/...), the command line and
# lib/cmake/moecheck/moecheckConfig.cmake, which exports moecheck::core, ::emulate, ::golden,
# ::reference, ::compare and ::cuda (where built) plus moecheck::numerics, the INTERFACE target
# that carries the numerics flags (-ffp-contract=off; for CUDA --fmad=false) to every consumer.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(MOECHECK_PACKAGE_TARGETS moecheck_numerics)
foreach(lib ${MOECHECK_LIBS})
  string(REPLACE "moecheck_" "" _short ${lib})
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${_short})
  list(APPEND MOECHECK_PACKAGE_TARGETS ${lib})
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${_short}/
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/moecheck/${_short}
          FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
endforeach()
install(TARGETS ${MOECHECK_PACKAGE_TARGETS} EXPORT moecheckTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(TARGET moecheck)
  install(TARGETS moecheck RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(EXPORT moecheckTargets NAMESPACE moecheck::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/moecheck)
set(MOECHECK_PACKAGE_HAS_CUDA ${MOECHECK_HAVE_CUDA})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/moecheckConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/moecheckConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/moecheck)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/moecheckConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/moecheckConfig.cmake
              ${PROJECT_BINARY_DIR}/moecheckConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/moecheck)
