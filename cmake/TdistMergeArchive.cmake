# TdistMergeArchive.cmake - append the members of one static archive to another.
#   cmake -DAR=<ar> -DARCHIVE=<libtdist.a> -DADD=<libjemalloc_pic.a> -DWORK=<dir> -P TdistMergeArchive.cmake
# Run after libtdist.a is archived (CMakeLists.txt, POST_BUILD): the private
# jemalloc travels inside libtdist.a, so a static consumer links nothing more
# for it and no separate archive is installed. Its symbols are all tdist__je_*
# with hidden visibility (cmake/TdistJemalloc.cmake): nothing in the consumer
# can bind to them by accident.
foreach(v AR ARCHIVE ADD WORK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "TdistMergeArchive.cmake: -D${v}=... missing")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
execute_process(COMMAND "${AR}" t "${ADD}" OUTPUT_VARIABLE members RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${AR} t ${ADD} failed (${rc})")
endif()
string(REGEX REPLACE "\n$" "" members "${members}")
string(REPLACE "\n" ";" members "${members}")
list(LENGTH members n)
# Extracting flattens the members into one folder: two of the same name
# would lose one.
set(unique ${members})
list(REMOVE_DUPLICATES unique)
list(LENGTH unique nu)
if(NOT n EQUAL nu)
  message(FATAL_ERROR "${ADD} holds members of the same name; cannot merge it by extraction")
endif()
execute_process(COMMAND "${AR}" x "${ADD}" WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${AR} x ${ADD} failed (${rc})")
endif()
set(objs "")
foreach(m ${members})
  list(APPEND objs "${WORK}/${m}")
endforeach()
# q: append (libtdist.a was just made afresh), s: rebuild the symbol index.
execute_process(COMMAND "${AR}" qs "${ARCHIVE}" ${objs} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${AR} qs ${ARCHIVE} failed (${rc})")
endif()
file(REMOVE_RECURSE "${WORK}")
