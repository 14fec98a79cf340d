# Note [Precompiled program headers]
# The examples, tools and benchmarks are about 45 programs of one source file each, and each spent
# most of its compile parsing kusari.h and CLI11 (10-15 s per program on a 2-core machine, minutes
# of every cold build). kusari_program_pch(target group headers...) precompiles `headers` once
# per `group` (the first target of the group owns the precompiled header) and lets the group's
# other targets reuse it. A group must share compile flags (same directory, same libraries),
# otherwise the compiler ignores the precompiled header and parses the headers as before: the
# result is the same either way. KUSARI_PROGRAM_PCH=OFF turns it off (see also Note [Precompiled
# test headers]).
option(KUSARI_PROGRAM_PCH "Precompile the headers the example, tool and benchmark programs share" ON)

function(kusari_program_pch target group)
  if(NOT KUSARI_PROGRAM_PCH)
    return()
  endif()
  get_property(_owner GLOBAL PROPERTY KUSARI_PCH_OWNER_${group})
  if(_owner)
    target_precompile_headers(${target} REUSE_FROM ${_owner})
  else()
    target_precompile_headers(${target} PRIVATE ${ARGN})
    set_property(GLOBAL PROPERTY KUSARI_PCH_OWNER_${group} ${target})
  endif()
endfunction()
