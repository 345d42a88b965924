/* Native replay of a captured graph of tinygrad CPU kernels (see replay.py).

Why native: a decode step of the default model is ~750 kernel calls, ~120 of them matvecs split into core_id slices
over a few cores. From Python each call costs ~1-2 us and each hand-off of slices to a thread pool ~50 us (wake-up of a
sleeping thread + a future), which is more than a small matvec takes; here a whole step is one call, and the slices of a
matvec are taken one by one by the calling thread and by pool threads that, between launches, spin for a short while
before they sleep on a futex.

Kernel ABI this relies on: a tinygrad CPU program is `void f(T0 a0, ..., Tn an)` whose parameters are all buffer
pointers or `int` variables. Every launch is called through one pointer type with MAX_ARGS uint64 parameters: under the
x86-64 SysV and AArch64 procedure call standards integer/pointer arguments are passed in order (registers, then stack
slots the caller owns and cleans up), a callee reads only the parameters it declares, and an `int` parameter reads the low
32 bits of its slot. replay.py refuses kernels with more than MAX_ARGS parameters.
*/
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_ARGS 16

typedef void (*kernel_fn)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);

/* Filled by replay.py (same field order as its ctypes Structure); only args[] and slices change between runs. */
typedef struct {
  kernel_fn fn;
  int32_t core_slot; /* -1: one call on the calling thread; else args[core_slot] = slice index (tinygrad's core_id) */
  int32_t slices;    /* core_id slices of this launch, split into contiguous runs over the pool's threads */
  uint64_t args[MAX_ARGS];
} launch_t;

typedef struct pool {
  int threads; /* including the thread that calls swl_run */
  int64_t spin_ns;
  _Atomic uint32_t epoch;          /* bumped for every sliced launch (and to stop): idle workers sleep on this word */
  _Atomic uint64_t ticket;         /* (epoch << 32) | next slice of the current launch to hand out */
  _Atomic uint32_t done;           /* slices of the current launch that have finished */
  _Atomic uint32_t sleepers;
  _Atomic int stop;
  _Atomic int parked;              /* set when a run ends: spinning for the next launch is pointless until the next run */
  _Atomic(launch_t *) cur;         /* the current sliced launch: stored before its epoch is published */
  struct worker_slot { pthread_t tid; struct pool *p; } workers[];
} pool_t;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static void futex(_Atomic uint32_t *word, int op, uint32_t val) { syscall(SYS_futex, word, op, val, NULL, NULL, 0); }

static void call(launch_t *l, const uint64_t *a) {
  l->fn(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]);
}

static void run_slice(launch_t *l, uint32_t s) {
  uint64_t a[MAX_ARGS];
  for (int i = 0; i < MAX_ARGS; i++) a[i] = l->args[i];
  a[l->core_slot] = s;
  call(l, a);
}

/* Take slices of epoch e's launch until none is left. Slices are handed out one at a time instead of in fixed shares:
   on a busy host a pool thread may not get a core for milliseconds, and a fixed share would make the whole step wait
   for it; this way the caller runs whatever nobody else took, and waits only for slices that are running.
   A stale helper (it saw epoch e, then was descheduled while the caller moved on) cannot take a slice of a later launch:
   the compare-exchange succeeds only while the ticket still carries epoch e with slices left, and until all of e's
   slices are done the caller neither stores the next launch nor a new ticket, so `l` read in between is e's launch. */
static void help(pool_t *p, uint32_t e) {
  uint64_t v = atomic_load_explicit(&p->ticket, memory_order_acquire);
  for (;;) {
    if ((uint32_t)(v >> 32) != e) return;
    launch_t *l = atomic_load_explicit(&p->cur, memory_order_relaxed);
    if ((uint32_t)v >= (uint32_t)l->slices) return;
    if (!atomic_compare_exchange_weak_explicit(&p->ticket, &v, v + 1, memory_order_acquire, memory_order_acquire)) continue;
    run_slice(l, (uint32_t)v);
    atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    v = atomic_load_explicit(&p->ticket, memory_order_acquire);
  }
}

/* Caller side of one sliced launch: publish it, help, wait for the slices others took. */
static void run_sliced(pool_t *p, launch_t *l) {
  uint32_t e = atomic_load_explicit(&p->epoch, memory_order_relaxed) + 1;  /* only the caller writes epoch */
  atomic_store_explicit(&p->cur, l, memory_order_relaxed);
  atomic_store_explicit(&p->done, 0, memory_order_relaxed);
  atomic_store_explicit(&p->ticket, (uint64_t)e << 32, memory_order_release);
  /* seq_cst pair with the sleeper's increment of sleepers before its futex_wait: one of the two sees the other */
  atomic_store(&p->epoch, e);
  if (atomic_load(&p->sleepers)) futex(&p->epoch, FUTEX_WAKE_PRIVATE, INT_MAX);
  help(p, e);
  for (int i = 1; atomic_load_explicit(&p->done, memory_order_acquire) < (uint32_t)l->slices; i++) {
    cpu_relax();
    if ((i & 1023) == 0) sched_yield();  /* a helper was descheduled mid-slice: let it have a core */
  }
}

static void *worker(void *arg) {
  pool_t *p = ((struct worker_slot *)arg)->p;
  uint32_t seen = 0;
  for (;;) {
    /* spin for a new launch (the next matvec of a step follows within microseconds), then sleep: an idle pool costs no
       CPU; at the end of a run at once (in a pipeline the stage's output is then on its way to the next host, whose
       edge driver and node want this core) */
    int64_t until = now_ns() + p->spin_ns;
    for (int i = 1; atomic_load_explicit(&p->epoch, memory_order_acquire) == seen; i++) {
      cpu_relax();
      if ((i & 63) == 0 && (atomic_load_explicit(&p->parked, memory_order_relaxed) || now_ns() > until)) {
        atomic_fetch_add(&p->sleepers, 1);
        while (atomic_load(&p->epoch) == seen) futex(&p->epoch, FUTEX_WAIT_PRIVATE, seen);
        atomic_fetch_sub(&p->sleepers, 1);
      }
    }
    seen = atomic_load_explicit(&p->epoch, memory_order_acquire);
    if (atomic_load(&p->stop)) return NULL;
    help(p, seen);
  }
}

void swl_pool_free(pool_t *p);

pool_t *swl_pool_new(int threads, int64_t spin_ns) {
  if (threads < 1) return NULL;
  pool_t *p = calloc(1, sizeof(pool_t) + sizeof(struct worker_slot) * (size_t)threads);
  if (!p) return NULL;
  p->threads = threads;
  p->spin_ns = spin_ns;
  for (int i = 1; i < threads; i++) {
    p->workers[i].p = p;
    if (pthread_create(&p->workers[i].tid, NULL, worker, &p->workers[i]) != 0) {
      p->threads = i;  /* stop and join the ones that started */
      swl_pool_free(p);
      return NULL;
    }
  }
  return p;
}

/* Runs the launches in order; returns when all have finished. Serial launches run on the caller while the pool's
   threads wait; a sliced launch is shared out (help). Not reentrant: one caller per pool at a time. */
void swl_run(pool_t *p, launch_t *job, int n) {
  atomic_store_explicit(&p->parked, 0, memory_order_relaxed);
  for (int j = 0; j < n; j++) {
    launch_t *l = &job[j];
    if (l->core_slot < 0) call(l, l->args);
    else if (p->threads == 1) for (int s = 0; s < l->slices; s++) run_slice(l, (uint32_t)s);
    else run_sliced(p, l);
  }
  atomic_store_explicit(&p->parked, 1, memory_order_relaxed);
}

void swl_pool_free(pool_t *p) {
  if (!p) return;
  atomic_store(&p->stop, 1);
  atomic_fetch_add(&p->epoch, 1);
  futex(&p->epoch, FUTEX_WAKE_PRIVATE, INT_MAX);
  for (int i = 1; i < p->threads; i++) pthread_join(p->workers[i].tid, NULL);
  free(p);
}
