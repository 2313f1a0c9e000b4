# kiln as another CMake project uses it: kiln's build installed into a prefix (cmake --install),
# then examples/cpp configured against that prefix with find_package(kiln), built and run on a
# model. Also checks that libkiln.so exports kiln's public API and nothing of its internals.
#
#   cmake -DBUILD_DIR=build -DSOURCE_DIR=. -DGENERATOR=Ninja -DCXX=c++ -DMODEL=m.onnx -P cpp_example.cmake
foreach(var BUILD_DIR SOURCE_DIR GENERATOR CXX MODEL)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "cpp_example.cmake: -D${var}=... is missing")
  endif()
endforeach()
set(work "${BUILD_DIR}/package-test")
file(REMOVE_RECURSE "${work}")

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (exit ${rc}):\n  ${ARGN}\n${out}\n${err}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

step("installing kiln" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${work}/prefix")
file(GLOB_RECURSE config "${work}/prefix/*/kilnConfig.cmake")
file(GLOB_RECURSE library "${work}/prefix/*/libkiln.so")
foreach(path config library)
  if(NOT ${path})
    message(FATAL_ERROR "the install into ${work}/prefix has no ${path} (kilnConfig.cmake, libkiln.so)")
  endif()
endforeach()
foreach(header kiln.h error.h tensor.h types.h)
  if(NOT EXISTS "${work}/prefix/include/kiln/${header}")
    message(FATAL_ERROR "the install into ${work}/prefix has no include/kiln/${header}")
  endif()
endforeach()

# Exported: kiln's public classes and functions (kiln::Engine, kiln::Tensor, ...). Not exported:
# anything of a namespace inside kiln (kiln::ir, kiln::cpu, kiln::onnx_import, ...), onnx.proto's
# classes, protobuf, BLAS.
step("nm" nm -D -C --defined-only "${library}")
string(REGEX MATCHALL "[^\n]+" symbols "${step_output}")
set(exported 0)
foreach(line IN LISTS symbols)
  if(line MATCHES " kiln::(Engine|Context|Tensor|Error)::")
    math(EXPR exported "${exported} + 1")
  endif()
  if(line MATCHES " (kiln::[a-z_0-9]+::|onnx::|google::|cblas_|sgemm_)")
    message(FATAL_ERROR "libkiln.so exports an internal symbol:\n  ${line}\n(src/api/libkiln.map lists what it exports)")
  endif()
endforeach()
if(exported LESS 20)
  message(FATAL_ERROR "libkiln.so exports ${exported} symbols of kiln::Engine, Context, Tensor and Error; the API has more")
endif()

step("configuring examples/cpp against the installed kiln" "${CMAKE_COMMAND}" -S "${SOURCE_DIR}/examples/cpp"
     -B "${work}/build" -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_COMPILER=${CXX}"
     "-DCMAKE_PREFIX_PATH=${work}/prefix")
step("building examples/cpp" "${CMAKE_COMMAND}" --build "${work}/build")
step("running kiln_example" "${work}/build/kiln_example" "${MODEL}" "${work}/model.engine")
message("${step_output}")
if(NOT step_output MATCHES "built, saved to .*, loaded: same outputs \\(cpu backend")
  message(FATAL_ERROR "kiln_example did not report the same outputs from the loaded engine")
endif()
