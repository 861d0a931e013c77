// Cross-core transfer probe (towers' bench/probe.sh): how fast one core reads
// data another core has just written, against re-reading it on the same core.
//
// Two threads, pinned to the first two CPUs this process may use, take turns:
// the writer fills a buffer (1 MiB by default, the size of a layer's weight
// gradient in the benchmark MLPs), then the reader reads it twice (the first
// read pulls every line from the other core's cache, the second from its own),
// and the roles swap. A two-tower step on the CPU moves its gradients and
// updated weights across cores this way every step, so its speed-up over one
// core follows the first figure: on a 2-vCPU VM the host's placement of the
// vCPUs (sharing a last-level cache or not) changes it by 3x from one minute
// to the next, which the FMA probe cannot see.
//
//   xcore [KiB] [rounds]   -> "xcore cross=G GB/s local=G GB/s" (medians)
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static size_t n;        // floats in the buffer
static int rounds;
static float *buf;
static atomic_int turn; // 2*round + (0: thread 0 writes, 1: thread 1 writes)
static double *cross, *local;
static volatile float sink;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int nth_cpu(int k) {
  cpu_set_t s;
  if (sched_getaffinity(0, sizeof s, &s) != 0) return -1;
  for (int c = 0, seen = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &s) && seen++ == k) return c;
  return -1;
}

// One 4-byte load per 64-byte line, four independent sums: the rate at which
// lines arrive, not the adder's.
static float read_all(void) {
  const unsigned *u = (const unsigned *)buf;
  unsigned a = 0, b = 0, c = 0, d = 0;
  for (size_t i = 0; i + 64 <= n; i += 64) { a += u[i]; b += u[i + 16]; c += u[i + 32]; d += u[i + 48]; }
  return (float)(a + b + c + d);
}

static void *run(void *arg) {
  int me = (int)(long)arg, cpu = nth_cpu(me);
  if (cpu >= 0) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
  }
  for (int r = 0; r < rounds; r++) {
    int writer = r & 1;
    if (me == writer) {
      while (atomic_load_explicit(&turn, memory_order_acquire) != 2 * r) {}
      for (size_t i = 0; i < n; i++) buf[i] = (float)(i + r);
      atomic_store_explicit(&turn, 2 * r + 1, memory_order_release);
    } else {
      while (atomic_load_explicit(&turn, memory_order_acquire) != 2 * r + 1) {}
      double t0 = now();
      float s = read_all();
      double t1 = now();
      s += read_all();
      double t2 = now();
      sink = s;
      cross[r] = t1 - t0;
      local[r] = t2 - t1;
      atomic_store_explicit(&turn, 2 * r + 2, memory_order_release);
    }
  }
  return NULL;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  size_t kib = argc > 1 ? strtoul(argv[1], NULL, 10) : 1024;
  rounds = argc > 2 ? atoi(argv[2]) : 300;
  if (kib == 0 || rounds < 10 || nth_cpu(1) < 0) {
    printf("xcore none (needs two CPUs, a size and at least 10 rounds)\n");
    return 0;
  }
  n = kib * 1024 / sizeof(float);
  buf = aligned_alloc(64, n * sizeof(float));
  cross = calloc(rounds, sizeof(double));
  local = calloc(rounds, sizeof(double));
  memset(buf, 0, n * sizeof(float));
  pthread_t t[2];
  for (long k = 0; k < 2; k++) pthread_create(&t[k], NULL, run, (void *)k);
  for (int k = 0; k < 2; k++) pthread_join(t[k], NULL);
  // Skip the first rounds (page faults, frequency ramp).
  int skip = rounds / 10, m = rounds - skip;
  qsort(cross + skip, m, sizeof(double), cmp);
  qsort(local + skip, m, sizeof(double), cmp);
  double bytes = (double)n * sizeof(float);
  printf("xcore cross=%.1f GB/s local=%.1f GB/s\n", bytes / cross[skip + m / 2] / 1e9, bytes / local[skip + m / 2] / 1e9);
  return 0;
}
