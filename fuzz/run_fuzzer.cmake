# One bounded libFuzzer run for CTest: a fresh work folder, a copy of the seed corpus in it,
# then the fuzzer on that copy with ARGS (a seed and a run count); fails when the fuzzer does.
#   cmake -DFUZZER=<binary> -DCORPUS=<seed folder> -DWORK=<work folder> "-DARGS=-seed=1;-runs=1000" -P run_fuzzer.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
file(COPY ${CORPUS}/ DESTINATION ${WORK}/corpus)
execute_process(COMMAND ${FUZZER} ${ARGS} -artifact_prefix=${WORK}/ ${WORK}/corpus
                WORKING_DIRECTORY ${WORK} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed (${rc}); what it found is in ${WORK}")
endif()
