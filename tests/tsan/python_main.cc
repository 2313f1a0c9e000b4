// The Python interpreter inside an executable built with ThreadSanitizer: the TSan runtime is
// linked here and starts before Python loads the instrumented kiln._kiln, which preloading
// clang's shared runtime into an uninstrumented python cannot do.
#include <Python.h>

int main(int argc, char** argv) { return Py_BytesMain(argc, argv); }
