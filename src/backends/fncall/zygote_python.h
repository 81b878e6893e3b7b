// The python runtime of dsec-zygote: an embedded CPython that imports its modules once; each
// call runs in a process forked from it, so it starts with those modules already loaded.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace dsec::fncall {

// Initializes the interpreter (isolated mode, UTF-8) and imports `preload`; freezes the
// heap's objects out of the garbage collector so forked children share its pages.
Status PythonInit(const std::vector<std::string>& preload);
void PythonBeforeFork();
void PythonAfterForkParent();
// First thing in a forked child that will run python code.
void PythonAfterForkChild();
// In a forked child (after PythonAfterForkChild): runs `code` as __main__ (SystemExit and
// tracebacks as `python3 -c` does), runs atexit handlers, flushes stdio and returns the exit code.
int PythonRunInChild(const std::string& code, const std::string& filename);

}  // namespace dsec::fncall
