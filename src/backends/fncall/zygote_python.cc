#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "backends/fncall/zygote_python.h"

namespace dsec::fncall {

namespace {

// Defined in a private module namespace; the call's own __main__ is a fresh module.
constexpr const char kBootstrap[] = R"PY(
import sys, types, traceback, gc

def _dsec_run(code, filename):
    mod = types.ModuleType("__main__")
    mod.__file__ = filename
    mod.__builtins__ = __builtins__
    sys.modules["__main__"] = mod
    sys.argv = [filename]
    rc = 0
    try:
        exec(compile(code, filename, "exec"), mod.__dict__)
    except SystemExit as e:
        c = e.code
        if c is None:
            rc = 0
        elif isinstance(c, int):
            rc = c & 0xFF
        else:
            try:
                print(c, file=sys.stderr)
            except BaseException:
                pass
            rc = 1
    except BaseException:
        try:
            t, v, tb = sys.exc_info()
            traceback.print_exception(t, v, tb.tb_next if tb is not None else None)
        except BaseException:
            pass
        rc = 1
    try:  # as at interpreter exit: wait for non-daemon threads, then atexit handlers
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
    except BaseException:
        pass
    try:
        import atexit
        atexit._run_exitfuncs()
    except BaseException:
        pass
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except BaseException:
            pass
    return rc
)PY";

PyObject* g_run = nullptr;

std::string FetchError() {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  std::string msg = "python error";
  if (value) {
    if (PyObject* s = PyObject_Str(value)) {
      if (const char* c = PyUnicode_AsUTF8(s)) msg = c;
      Py_DECREF(s);
    }
    if (type) {
      if (PyObject* n = PyObject_GetAttrString(type, "__name__")) {
        if (const char* c = PyUnicode_AsUTF8(n)) msg = std::string(c) + ": " + msg;
        Py_DECREF(n);
      }
    }
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  PyErr_Clear();
  return msg;
}

}  // namespace

Status PythonInit(const std::vector<std::string>& preload) {
  PyPreConfig pre;
  PyPreConfig_InitIsolatedConfig(&pre);
  pre.utf8_mode = 1;
  PyStatus st = Py_PreInitialize(&pre);
  if (PyStatus_Exception(st))
    return InternalError(std::string("python preinit: ") + (st.err_msg ? st.err_msg : "failed"));
  PyConfig config;
  PyConfig_InitIsolatedConfig(&config);
  config.write_bytecode = 0;
  config.parse_argv = 0;
  config.install_signal_handlers = 1;  // as `python3 -c` (SIGINT -> KeyboardInterrupt, SIGPIPE)
  st = PyConfig_SetBytesString(&config, &config.program_name, "python3");
  if (!PyStatus_Exception(st)) st = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(st))
    return InternalError(std::string("python init: ") + (st.err_msg ? st.err_msg : "failed"));
  for (const auto& m : preload) {
    PyObject* mod = PyImport_ImportModule(m.c_str());
    if (!mod) return InvalidArgument("preload \"" + m + "\": " + FetchError());
    Py_DECREF(mod);
  }
  PyObject* ns = PyDict_New();
  PyDict_SetItemString(ns, "__builtins__", PyEval_GetBuiltins());
  PyObject* r = PyRun_String(kBootstrap, Py_file_input, ns, ns);
  if (!r) return InternalError("python bootstrap: " + FetchError());
  Py_DECREF(r);
  g_run = PyDict_GetItemString(ns, "_dsec_run");
  Py_XINCREF(g_run);
  if (!g_run) return InternalError("python bootstrap defined no runner");
  // Everything imported so far lives as long as the zygote: keep the collector from touching
  // (and so un-sharing) those pages in every forked call.
  r = PyRun_String("gc.collect(); gc.freeze()", Py_file_input, ns, ns);
  if (!r) return InternalError("python gc.freeze: " + FetchError());
  Py_DECREF(r);
  return OkStatus();
}

void PythonBeforeFork() { PyOS_BeforeFork(); }
void PythonAfterForkParent() { PyOS_AfterFork_Parent(); }

void PythonAfterForkChild() { PyOS_AfterFork_Child(); }

int PythonRunInChild(const std::string& code, const std::string& filename) {
  PyObject* c = PyUnicode_DecodeUTF8(code.data(), static_cast<Py_ssize_t>(code.size()), "replace");
  PyObject* f = PyUnicode_FromString(filename.c_str());
  PyObject* r = c && f ? PyObject_CallFunctionObjArgs(g_run, c, f, nullptr) : nullptr;
  int rc = 1;
  if (r && PyLong_Check(r)) rc = static_cast<int>(PyLong_AsLong(r));
  if (!r) PyErr_Print();
  return rc;
}

}  // namespace dsec::fncall
