# Install rules and Debian packages (included by the top CMakeLists.txt).
#
# `cmake --install BUILD [--prefix P]` installs, from an already built tree:
#   lib/libaxon.so.MAJOR.MINOR.PATCH (SONAME libaxon.so.MAJOR), its symlinks;
#   lib/libaxon_cuda.so.MAJOR... (the CUDA backend, where it was built);
#   bin/axon-agent, axon-run, axon-bench (RUNPATH $ORIGIN/../lib);
#   include/axon/<same relative paths as in the source tree>/*.h (the public
#     headers: not *-impl.h nor the internal ones listed below), so a program
#     compiles with -I P/include and #include <axon/rpc/node.h>;
#   lib/pkgconfig/axon.pc and lib/cmake/axon/ (find_package(axon) ->
#     axon::axon);
#   share/axon/launch/ (systemd unit, environment file, Slurm and mpirun
#     examples) and lib/systemd/system/axon-agent.service.
# `cpack -G DEB` (in BUILD) makes one package per component: libaxon0 (lib),
# axon (agent and tools), libaxon-dev (headers, pkg-config, CMake files),
# libaxon-cuda0 (the CUDA backend, where it was built).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set_target_properties(axon PROPERTIES VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR})
target_include_directories(axon INTERFACE
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
install(TARGETS axon EXPORT axonTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT lib
    NAMELINK_COMPONENT dev)
# The CUDA backend, loaded on demand from the same directory: its own
# package (libaxon-cuda0), so CPU-only hosts need no CUDA library.
if(TARGET axon_cuda)
  install(TARGETS axon_cuda
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT cuda
      NAMELINK_SKIP)
endif()

set(AX_PROGRAMS axon-agent axon-run axon-bench)
foreach(p ${AX_PROGRAMS})
  if(TARGET ${p})
    set_target_properties(${p} PROPERTIES
      INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
    install(TARGETS ${p} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
      COMPONENT tools)
  endif()
endforeach()

# Headers that are public by name but internal by content: the CPU
# backend's kernels, the transport table, the RPC test hooks and the stage
# host's own parts (axi_ functions, *-impl.h includes).
set(AX_INTERNAL_HEADERS kernels/cpu/cpu.h rpc/transport.h rpc/rpc-debug.h
  runtime/pipeline/trace/stage_events.h)
file(GLOB_RECURSE AX_PUBLIC_HEADERS RELATIVE ${CMAKE_SOURCE_DIR}
  CONFIGURE_DEPENDS kernels/*.h models/*.h rpc/*.h rref/*.h runtime/*.h)
list(FILTER AX_PUBLIC_HEADERS EXCLUDE REGEX "-impl\\.h$")
list(REMOVE_ITEM AX_PUBLIC_HEADERS ${AX_INTERNAL_HEADERS})
foreach(h ${AX_PUBLIC_HEADERS})
  get_filename_component(dir ${h} DIRECTORY)
  install(FILES ${h} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/axon/${dir}
    COMPONENT dev)
endforeach()
# The install test compiles a program that includes every one of them.
string(REPLACE ";" " " AX_PUBLIC_HEADERS_STR "${AX_PUBLIC_HEADERS}")
file(WRITE ${CMAKE_BINARY_DIR}/axon_public_headers.txt "${AX_PUBLIC_HEADERS_STR}\n")

file(RELATIVE_PATH AX_PC_UP /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
string(REGEX REPLACE "/$" "" AX_PC_UP "${AX_PC_UP}")
configure_file(${CMAKE_SOURCE_DIR}/cmake/axon.pc.in
  ${CMAKE_BINARY_DIR}/axon.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/axon.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

set(AX_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/axon)
install(EXPORT axonTargets NAMESPACE axon:: DESTINATION ${AX_CMAKE_DIR}
  COMPONENT dev)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/axonConfig.cmake.in
  ${CMAKE_BINARY_DIR}/axonConfig.cmake INSTALL_DESTINATION ${AX_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/axonConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/axonConfig.cmake
  ${CMAKE_BINARY_DIR}/axonConfigVersion.cmake
  DESTINATION ${AX_CMAKE_DIR} COMPONENT dev)

file(GLOB AX_LAUNCH_FILES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/scripts/launch/*)
if(AX_LAUNCH_FILES)
  install(FILES ${AX_LAUNCH_FILES} DESTINATION ${CMAKE_INSTALL_DATADIR}/axon/launch
    COMPONENT tools)
endif()
if(EXISTS ${CMAKE_SOURCE_DIR}/scripts/launch/axon-agent.service)
  install(FILES ${CMAKE_SOURCE_DIR}/scripts/launch/axon-agent.service
    DESTINATION lib/systemd/system COMPONENT tools)
endif()

# ---- Debian packages --------------------------------------------------------
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME axon)
set(CPACK_PACKAGE_VENDOR axon)
set(CPACK_PACKAGE_CONTACT "axon maintainers <axon@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "axon distributed deep-learning runtime")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL lib tools dev)
if(TARGET axon_cuda)
  list(APPEND CPACK_COMPONENTS_ALL cuda)
endif()
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_STRIP_FILES ON)
# Dependencies from dpkg-shlibdeps; the programs' own libaxon.so.0 is found
# in the build tree, and the library package gets a shlibs file.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_BINARY_DIR})
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_LIB_PACKAGE_NAME libaxon${PROJECT_VERSION_MAJOR})
set(CPACK_DEBIAN_LIB_DESCRIPTION "axon runtime library\n libaxon: tensors, kernels, models, RPC, RRefs, distributed autograd, pipelines.")
set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME axon)
set(CPACK_DEBIAN_TOOLS_DESCRIPTION "axon agent and tools\n axon-agent (the daemon on each host), axon-run, axon-bench, launch examples.")
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libaxon-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_DESCRIPTION "axon development files\n Headers, axon.pc and the CMake package (find_package(axon)).")
# Inter-package dependencies from the component ones (libaxon0 (= version)).
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)
set(CPACK_COMPONENT_TOOLS_DEPENDS lib)
set(CPACK_COMPONENT_DEV_DEPENDS lib)
set(CPACK_COMPONENT_CUDA_DEPENDS lib)
set(CPACK_DEBIAN_CUDA_PACKAGE_NAME libaxon-cuda${PROJECT_VERSION_MAJOR})
set(CPACK_DEBIAN_CUDA_DESCRIPTION "axon CUDA backend\n libaxon_cuda.so: the CUDA kernels (cuBLAS, cuDNN), loaded by libaxon when a CUDA device is first used. Needs the CUDA toolkit's libraries (libcudart, libcublas, libcudnn), which are not Debian packages here.")
# The CUDA libraries come from the toolkit under /usr/local/cuda, not from
# packages: no shlibs dependency can name them.
set(CPACK_DEBIAN_CUDA_PACKAGE_SHLIBDEPS OFF)
include(CPack)
