# Installs kusari as a CMake package: headers, the libraries, kusariConfig.cmake with its version
# file and exported targets (kusari::kusari, kusari::mn), and a pkg-config file (kusari.pc,
# kusari-mn.pc). An out-of-tree project then needs only
#
#     find_package(kusari REQUIRED)            # -DCMAKE_PREFIX_PATH=<prefix>
#     target_link_libraries(app PRIVATE kusari::kusari)   # kusari::mn for multi-node programs
#
# tests/install_consumer is such a project; CI builds and runs it against an install.
include(CMakePackageConfigHelpers)

set(KUSARI_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/kusari)

install(TARGETS kusari EXPORT kusariTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(TARGET kusari_mn)
  install(TARGETS kusari_mn EXPORT kusariTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
# The libraries loaded at run time are no targets of the package: nothing links them.
foreach(_loaded kusari_cuda kusari_mn_nccl)
  if(TARGET ${_loaded})
    install(TARGETS ${_loaded} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  endif()
endforeach()
# A static library carries its dependencies to the program: the helper targets go along, and the
# config finds the imported ones again (kusariStaticDependencies.cmake).
if(NOT BUILD_SHARED_LIBS)
  foreach(_helper kusari_blas kusari_cudnn kusari_nccl)
    if(TARGET ${_helper})
      install(TARGETS ${_helper} EXPORT kusariTargets)
    endif()
  endforeach()
endif()

install(DIRECTORY include/kusari DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/include/kusari/config.h ${CMAKE_CURRENT_BINARY_DIR}/include/kusari/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kusari)

install(EXPORT kusariTargets NAMESPACE kusari:: DESTINATION ${KUSARI_INSTALL_CMAKEDIR})

set(KUSARI_PACKAGE_STATIC OFF)
if(NOT BUILD_SHARED_LIBS)
  set(KUSARI_PACKAGE_STATIC ON)
endif()
set(KUSARI_PACKAGE_MN OFF)
if(TARGET kusari_mn)
  set(KUSARI_PACKAGE_MN ON)
endif()
configure_package_config_file(cmake/kusariConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/kusariConfig.cmake
  INSTALL_DESTINATION ${KUSARI_INSTALL_CMAKEDIR})
# 0.x: a minor version may change the interface, so only the same minor version is compatible.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/kusariConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kusariConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/kusariConfigVersion.cmake
        DESTINATION ${KUSARI_INSTALL_CMAKEDIR})
if(NOT BUILD_SHARED_LIBS)
  install(FILES cmake/kusariStaticDependencies.cmake DESTINATION ${KUSARI_INSTALL_CMAKEDIR})
endif()

# The job templates (docs/cluster.md): copied from <prefix>/share/kusari/jobs/ on a cluster.
install(PROGRAMS jobs/pbs.sh jobs/pbs_imagenet.sh jobs/slurm.sh jobs/slurm_imagenet.sh jobs/hostfile.sh
        DESTINATION ${CMAKE_INSTALL_DATADIR}/kusari/jobs)
install(FILES jobs/env.sh DESTINATION ${CMAKE_INSTALL_DATADIR}/kusari/jobs)

# pkg-config, for Makefiles and other build systems (it describes the shared libraries; a
# static build is for CMake projects, whose config carries the dependencies). The prefix is
# found from the file's own place (${pcfiledir}), so the files are right wherever
# `cmake --install build --prefix P` puts the install, and after it is moved.
file(RELATIVE_PATH KUSARI_PC_PREFIX_FROM_PCFILEDIR
     "/kusari-prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/kusari-prefix")
configure_file(cmake/kusari.pc.in ${CMAKE_CURRENT_BINARY_DIR}/kusari.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kusari.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(TARGET kusari_mn)
  configure_file(cmake/kusari-mn.pc.in ${CMAKE_CURRENT_BINARY_DIR}/kusari-mn.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kusari-mn.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endif()
