# Install rules (included by CMakeLists.txt when NABLA_INSTALL is on):
#   include/nabla/*.h, lib/libnabla.so.X.Y.Z (+ SONAME link), lib/libnabla.a,
#   bin/nabla, lib/pkgconfig/nabla.pc and nabla-static.pc,
#   lib/cmake/nabla/ (find_package).
# Everything is relative to the prefix given at install time
# (cmake --install build --prefix P), so the tree can be moved.
include(CMakePackageConfigHelpers)
set(NABLA_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/nabla)

install(TARGETS nabla_shared nabla_static EXPORT nablaTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS nabla RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
file(GLOB NABLA_PUBLIC_HEADERS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/include/nabla/*.h)
install(FILES ${NABLA_PUBLIC_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/nabla)

# CMake package: nabla::nabla (shared) and nabla::nabla_static, whose link
# interface names the dependencies that nablaDeps.cmake finds again.
if(NABLA_WITH_OPENBLAS)
  set(NABLA_WITH_OPENBLAS ON)
else()
  set(NABLA_WITH_OPENBLAS OFF)
endif()
install(EXPORT nablaTargets NAMESPACE nabla:: DESTINATION ${NABLA_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/nablaConfig.cmake.in
    ${PROJECT_BINARY_DIR}/nablaConfig.cmake INSTALL_DESTINATION ${NABLA_CMAKE_DIR})
# 0.x releases may break the API at every minor version, later ones at majors
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(nabla_compat SameMinorVersion)
else()
  set(nabla_compat SameMajorVersion)
endif()
write_basic_package_version_file(${PROJECT_BINARY_DIR}/nablaConfigVersion.cmake COMPATIBILITY ${nabla_compat})
install(FILES ${PROJECT_BINARY_DIR}/nablaConfig.cmake ${PROJECT_BINARY_DIR}/nablaConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/nablaDeps.cmake
        DESTINATION ${NABLA_CMAKE_DIR})

# pkg-config: `pkg-config --cflags --libs nabla` links libnabla.so (--static
# adds the dependencies libnabla.a needs, for a fully static link);
# nabla-static links libnabla.a by path, beside an installed libnabla.so.
# The prefix is found from the .pc file's own place (${pcfiledir}), so it
# holds for any install prefix.
file(RELATIVE_PATH NABLA_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" NABLA_PC_TO_PREFIX "${NABLA_PC_TO_PREFIX}")
set(NABLA_PC_REQUIRES_PRIVATE "libzstd libpcre2-8 libcjson yaml-0.1 libutf8proc")
if(NABLA_WITH_OPENBLAS)
  string(APPEND NABLA_PC_REQUIRES_PRIVATE " openblas")
endif()
if(NABLA_WITH_MPI) # the dist library (Open MPI's pkg-config name)
  string(APPEND NABLA_PC_REQUIRES_PRIVATE " mpi-c")
endif()
foreach(pc nabla nabla-static)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${pc}.pc.in ${PROJECT_BINARY_DIR}/${pc}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/${pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()
