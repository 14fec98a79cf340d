# Note [One C++ runtime]
# A GCC whose installation has libstdc++.a but no libstdc++.so (some clusters' and containers'
# compilers are built or wrapped so) links the C++ runtime statically into every shared library
# it makes. libkusari, libkusari_mn, the CUDA backend and the Python module then each carry a
# private copy of libstdc++, beside the system's that Python, NumPy or PyTorch load: iostreams and
# locales set up by one copy are used by another, and the first number written into a
# std::ostringstream inside Python (an array's repr, an error message naming a rank) crashes.
# So with shared libraries, a GNU compiler without libstdc++.so gets the directory of another
# GCC's libstdc++.so of this machine (the system's, /usr/lib/gcc/<triple>/<version>, the same
# major version preferred, else the newest) on the link line, and every library then needs the
# one libstdc++.so.6; when there is none, configuring stops and says what to do.
if(BUILD_SHARED_LIBS AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so
                  OUTPUT_VARIABLE _kusari_stdcxx OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT IS_ABSOLUTE "${_kusari_stdcxx}")
    set(_kusari_stdcxx_dir "")
    if(KUSARI_LIBSTDCXX_DIR)
      set(_kusari_stdcxx_dir "${KUSARI_LIBSTDCXX_DIR}")
    else()
      string(REGEX MATCH "^[0-9]+" _kusari_major "${CMAKE_CXX_COMPILER_VERSION}")
      file(GLOB _kusari_candidates "/usr/lib/gcc/${CMAKE_LIBRARY_ARCHITECTURE}/*/libstdc++.so")
      list(SORT _kusari_candidates COMPARE NATURAL ORDER DESCENDING)
      foreach(_c ${_kusari_candidates})
        get_filename_component(_d "${_c}" DIRECTORY)
        get_filename_component(_v "${_d}" NAME)
        if(NOT _kusari_stdcxx_dir OR _v STREQUAL _kusari_major)
          set(_kusari_stdcxx_dir "${_d}")
        endif()
      endforeach()
    endif()
    if(NOT _kusari_stdcxx_dir OR NOT EXISTS "${_kusari_stdcxx_dir}/libstdc++.so")
      message(FATAL_ERROR
        "kusari: the C++ compiler ${CMAKE_CXX_COMPILER} has no shared libstdc++ (-print-file-name=libstdc++.so "
        "finds none), so each of kusari's shared libraries and its Python module would carry a copy of the C++ "
        "runtime of its own, which crashes (Note [One C++ runtime] in cmake/KusariSharedCxxRuntime.cmake). Use a "
        "compiler with libstdc++.so (e.g. -DCMAKE_CXX_COMPILER=/usr/bin/g++), name the folder of one with "
        "-DKUSARI_LIBSTDCXX_DIR=<dir>, or, for C++ programs only, build static libraries (-DBUILD_SHARED_LIBS=OFF: one copy in each program)")
    endif()
    add_link_options("-L${_kusari_stdcxx_dir}")
    message(STATUS "kusari: ${CMAKE_CXX_COMPILER} has no shared libstdc++; linking the one in ${_kusari_stdcxx_dir} "
                   "(Note [One C++ runtime])")
  endif()
endif()
