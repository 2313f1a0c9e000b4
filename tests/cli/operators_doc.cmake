# Checks that the committed docs/operators.md is what `kiln operators --markdown` prints now.
#   cmake -DKILN=path/to/kiln -DDOC=docs/operators.md -P operators_doc.cmake
execute_process(COMMAND "${KILN}" operators --markdown RESULT_VARIABLE rc OUTPUT_VARIABLE generated)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kiln operators --markdown failed (${rc})")
endif()
if(NOT EXISTS "${DOC}")
  message(FATAL_ERROR "${DOC} is missing; create it with: kiln operators --markdown > docs/operators.md")
endif()
file(READ "${DOC}" committed)
if(NOT committed STREQUAL generated)
  message(FATAL_ERROR "${DOC} is out of date (an importer, op schema or CPU kernel changed); regenerate it with:\n"
                      "  build/kiln operators --markdown > docs/operators.md")
endif()
