/*
 * clock_shift: an LD_PRELOAD shim that shifts a process's wall clock by an offset read from a
 * file, for stepping redis-server's clock in tests. Debian's libfaketime cannot start Debian's
 * redis-server (its jemalloc calls clock_gettime while libfaketime initialises: "Unexpected
 * recursive calls to clock_gettime()"), so this shim allocates nothing and calls the kernel
 * directly. CLOCK_SHIFT_FILE names a file holding the offset in microseconds (e.g. -60000000);
 * it is read on every call, so writing the file steps the clock at once. Monotonic clocks are
 * left alone.
 *
 * Build: cc -shared -fPIC -O2 -o clock_shift.so clock_shift.c
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long offset_us(void) {
  const char *path = getenv("CLOCK_SHIFT_FILE");
  if (!path) return 0;
  int fd = (int)syscall(SYS_open, path, O_RDONLY);
  if (fd < 0) return 0;
  char buf[32];
  long n = (long)syscall(SYS_read, fd, buf, sizeof buf - 1);
  syscall(SYS_close, fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  long long value = 0;
  int sign = 1, i = 0;
  if (buf[0] == '-') { sign = -1; i = 1; }
  for (; buf[i] >= '0' && buf[i] <= '9'; i++) value = value * 10 + (buf[i] - '0');
  return sign * value;
}

static int real_clock_gettime(clockid_t clock, struct timespec *ts) {
  return (int)syscall(SYS_clock_gettime, clock, ts);
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
  int rc = real_clock_gettime(clock, ts);
  if (rc == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_us() * 1000LL;
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
  }
  return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
  (void)tz;
  struct timespec ts;
  int rc = clock_gettime(CLOCK_REALTIME, &ts);
  if (rc == 0 && tv) {
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
  }
  return rc;
}

time_t time(time_t *out) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (out) *out = ts.tv_sec;
  return ts.tv_sec;
}
