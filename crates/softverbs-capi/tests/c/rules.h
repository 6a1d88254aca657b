/*
 * What our C rule programs (cq_rules.c, protection.c) share: failure reporting with the
 * rule's name, a watchdog per rule, bounded waits, and connecting an RC QP to another QP
 * of the same device. Each program prints one "rule NAME...: ok" line per rule (its own
 * rule_ok) and "ok <checks> checks" at the end; exits 1 with "FAIL rule NAME: ..." on
 * stderr at the first failed check, 2 when the watchdog fires.
 *
 * Header-only (static functions, those a program may not need marked unused): each
 * program is one translation unit.
 */
#ifndef SOFTVERBS_TEST_RULES_H
#define SOFTVERBS_TEST_RULES_H

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

/* ------------------------------------------------------------------ reporting */

static const char *volatile rule = "setup";
static int checks;

static void fail(const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4), noreturn));

static void fail(const char *file, int line, const char *fmt, ...)
{
	int saved = errno;
	va_list ap;
	fprintf(stderr, "FAIL rule %s: %s:%d: ", rule, file, line);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (errno %d: %s)\n", saved, strerror(saved));
	exit(1);
}

#define FAIL(...) fail(__FILE__, __LINE__, __VA_ARGS__)

#define CHECK(cond)                                                                   \
	do {                                                                          \
		checks++;                                                             \
		if (!(cond))                                                          \
			FAIL("check failed: %s", #cond);                              \
	} while (0)

#define CHECKF(cond, ...)                                                             \
	do {                                                                          \
		checks++;                                                             \
		if (!(cond))                                                          \
			FAIL(__VA_ARGS__);                                            \
	} while (0)

/* Seconds a rule may take before the watchdog ends the program (valgrind is slow). */
#define RULE_SECONDS 120

/* The SIGALRM handler: names the rule that ran too long. */
static void watchdog(int sig)
{
	(void)sig;
	/* async-signal-safe: write + _exit */
	static const char a[] = "FAIL rule ";
	static const char b[] = ": watchdog: a call blocked (or the rule ran) for more than "
				"the rule's time limit\n";
	const char *r = rule;
	if (write(2, a, sizeof(a) - 1) < 0 || write(2, r, strlen(r)) < 0 ||
	    write(2, b, sizeof(b) - 1) < 0)
		_exit(3);
	_exit(2);
}

static void start_rule(const char *name)
{
	rule = name;
	alarm(RULE_SECONDS);
}

/* ------------------------------------------------------------------ time, waits */

/* A positive wait (something must happen) gives up after this long. */
#define WAIT_MS 10000
/* A negative wait (nothing may happen) looks this long. */
#define QUIET_MS 200
/* Every polling loop also stops after this many iterations. */
#define MAX_ITERS 2000000

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*
 * Collects up to `want` completions from cq into out within timeout_ms (bounded). Returns
 * the number collected (fewer on timeout), or the negative value ibv_poll_cq returned.
 */
static __attribute__((unused)) int poll_until(struct ibv_cq *cq, int want, struct ibv_wc *out, int timeout_ms)
{
	int got = 0;
	int64_t deadline = now_ms() + timeout_ms;
	for (int iter = 0; iter < MAX_ITERS && got < want; iter++) {
		int n = ibv_poll_cq(cq, want - got, out + got);
		if (n < 0)
			return n;
		got += n;
		if (got >= want || now_ms() >= deadline)
			break;
		if (n == 0)
			usleep(50); /* let the device's progress thread run (valgrind serialises) */
	}
	return got;
}

/* ------------------------------------------------------------------ device, QPs */

/* Opens the one device the drop-in lists, softverbs0. */
static struct ibv_context *open_softverbs0(void)
{
	int num = 0;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECK(list != NULL);
	CHECKF(num == 1 && strcmp(ibv_get_device_name(list[0]), "softverbs0") == 0,
	       "expected the one device softverbs0, got %d devices", num);
	struct ibv_context *context = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	CHECK(context != NULL);
	return context;
}

/*
 * RESET -> INIT -> RTR -> RTS towards `remote`, a QP of the same device reached at `gid`
 * (GID index 0), granting the peer `access` (IBV_ACCESS_REMOTE_*).
 */
static __attribute__((unused)) void connect_rc(struct ibv_qp *qp, uint32_t remote, const union ibv_gid *gid,
		       unsigned int access)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = 1,
		.qp_access_flags = access,
	};
	CHECKF(ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0,
	       "modify QP %u to INIT", qp->qp_num);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = remote;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.sgid_index = 0;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	CHECKF(ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				     IBV_QP_MIN_RNR_TIMER) == 0,
	       "modify QP %u to RTR", qp->qp_num);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	CHECKF(ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0,
	       "modify QP %u to RTS", qp->qp_num);
}

/*
 * Fresh pages, placed far below the kernel's usual mmap area (a distinct 16 MiB slot per
 * call, clear of AddressSanitizer's shadow and heap) so that once a rule unmaps them no
 * other mapping of the process (a thread stack, a malloc arena) lands at the same address:
 * an address unmapped and mapped again by something else is the one case the device
 * cannot see.
 */
static inline void *map_far_pages(size_t pages, int prot)
{
	const size_t page = 4096;
	static uintptr_t next = 0x500000000000ULL;
	for (int tries = 0; tries < 64; tries++, next += 0x1000000) {
		void *p = mmap((void *)next, pages * page, prot,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
		if (p == (void *)next) {
			next += 0x1000000;
			return p;
		}
		if (p != MAP_FAILED)
			munmap(p, pages * page);
	}
	FAIL("no free address for %zu pages", pages);
}

#endif
