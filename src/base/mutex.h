// A mutex, its scoped lock and a condition variable that clang's thread-safety analysis
// understands, and the annotation macros for what they guard.
//
// Members a mutex protects are declared `T x_ DSEC_GUARDED_BY(mu_);`, functions that must be
// called with it held `DSEC_REQUIRES(mu_)`, and functions that take it themselves
// `DSEC_EXCLUDES(mu_)`. A clang build with -Wthread-safety (the asan preset, which CI builds with
// warnings as errors) then rejects an access without the lock; CMakeLists.txt checks that the
// analysis really is on in that build. GCC ignores the attributes, so the release build's code
// is what it would be with std::mutex and std::lock_guard directly.
//
// A lambda that runs under the lock (a condition-variable predicate) says so:
//   cv_.Wait(lock, [&]() DSEC_REQUIRES(mu_) { return !queue_.empty(); });
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define DSEC_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define DSEC_THREAD_ANNOTATION(x)
#endif

#define DSEC_CAPABILITY(x) DSEC_THREAD_ANNOTATION(capability(x))
#define DSEC_SCOPED_CAPABILITY DSEC_THREAD_ANNOTATION(scoped_lockable)
#define DSEC_GUARDED_BY(x) DSEC_THREAD_ANNOTATION(guarded_by(x))
#define DSEC_PT_GUARDED_BY(x) DSEC_THREAD_ANNOTATION(pt_guarded_by(x))
#define DSEC_REQUIRES(...) DSEC_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define DSEC_EXCLUDES(...) DSEC_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define DSEC_ACQUIRE(...) DSEC_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define DSEC_RELEASE(...) DSEC_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define DSEC_TRY_ACQUIRE(...) DSEC_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define DSEC_NO_THREAD_SAFETY_ANALYSIS DSEC_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace dsec {

class DSEC_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() DSEC_ACQUIRE() { mu_.lock(); }
  void Unlock() DSEC_RELEASE() { mu_.unlock(); }
  bool TryLock() DSEC_TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds a Mutex for its scope (like std::unique_lock: it may be released and taken again
// inside the scope, and a CondVar waits on it).
class DSEC_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) DSEC_ACQUIRE(mu) : lock_(mu.mu_) {}
  ~MutexLock() DSEC_RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() DSEC_RELEASE() { lock_.unlock(); }
  void Lock() DSEC_ACQUIRE() { lock_.lock(); }

 private:
  friend class CondVar;
  std::unique_lock<std::mutex> lock_;
};

class CondVar {
 public:
  void Wait(MutexLock& l) { cv_.wait(l.lock_); }
  template <class Predicate>
  void Wait(MutexLock& l, Predicate ready) {
    cv_.wait(l.lock_, std::move(ready));
  }
  // Returns the predicate's last value (false: timed out still not ready).
  template <class Rep, class Period, class Predicate>
  bool WaitFor(MutexLock& l, std::chrono::duration<Rep, Period> d, Predicate ready) {
    return cv_.wait_for(l.lock_, d, std::move(ready));
  }
  template <class Clock, class Duration, class Predicate>
  bool WaitUntil(MutexLock& l, std::chrono::time_point<Clock, Duration> t, Predicate ready) {
    return cv_.wait_until(l.lock_, t, std::move(ready));
  }
  // Returns false when it timed out.
  template <class Rep, class Period>
  bool WaitFor(MutexLock& l, std::chrono::duration<Rep, Period> d) {
    return cv_.wait_for(l.lock_, d) == std::cv_status::no_timeout;
  }
  template <class Clock, class Duration>
  bool WaitUntil(MutexLock& l, std::chrono::time_point<Clock, Duration> t) {
    return cv_.wait_until(l.lock_, t) == std::cv_status::no_timeout;
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace dsec
