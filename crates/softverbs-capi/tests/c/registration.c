/*
 * Memory registration on the drop-in as on a kernel device (ibv_reg_mr(3); the kernel's
 * ib_umem_get pins every page of the range, and rdma-core reports its errno): a range that
 * cannot be pinned is refused with the same errno, and memory the application unmaps
 * while it is registered makes the device's access fail, never the process crash.
 *
 *   1 a range whose pages are not mapped (an mmap then munmap; NULL): NULL with EFAULT,
 *     through ibv_reg_mr, ibv_reg_mr_iova and ibv_reg_mr_iova2
 *   2 a read-only mapping with write access asked (LOCAL_WRITE; REMOTE_WRITE and
 *     REMOTE_ATOMIC with it): NULL with EFAULT (the kernel pins with FOLL_WRITE)
 *   3 the same read-only mapping without write access (REMOTE_READ, or none): registered
 *   4 length 0: NULL with EINVAL
 *   5 1 TiB over a 4 KiB malloc: NULL with EFAULT, or ENOMEM where RLIMIT_MEMLOCK applies
 *     (not infinite and no CAP_IPC_LOCK: ib_umem_get charges the pages before it pins them)
 *   6 an RC loopback pair: a region registered with remote write, then munmapped; the
 *     peer's RDMA WRITE into it completes with IBV_WC_REM_ACCESS_ERR and the program lives
 *     (before the device's fault-tolerant copies it died with SIGSEGV); the region still
 *     deregisters
 *   7 RLIMIT_MEMLOCK: with CAP_IPC_LOCK dropped and the soft limit at 64 KiB, 32 KiB
 *     registers, 64 KiB more is NULL with ENOMEM, and deregistering gives the pages back
 *
 * Under valgrind rule 6 is left out (memcheck itself reports the device's store into the
 * unmapped pages as an invalid write before the fault is recovered); the sanitizer build
 * and the plain build run it.
 *
 * Prints one "rule N ... ok" line per rule and "ok <checks> checks" at the end; exits 1
 * with "FAIL rule N (...)" on stderr at the first failed check. Every wait is bounded and a
 * watchdog alarm ends the program naming the rule if a call blocks.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <linux/capability.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <valgrind/valgrind.h>

#include "rules.h"

#define PAGE 4096

static void rule_ok(const char *what)
{
	alarm(0);
	printf("rule %s: %s: ok\n", rule, what);
	fflush(stdout);
}

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;

/* ibv_reg_mr must fail with `expected`. */
#define REFUSED(call, expected)                                                        \
	do {                                                                          \
		errno = 0;                                                            \
		struct ibv_mr *refused_mr = (call);                                   \
		CHECKF(refused_mr == NULL && errno == (expected),                     \
		       "%s: expected NULL with errno %d (%s)", #call, (expected),     \
		       strerror(expected));                                           \
	} while (0)

static void rule_unmapped(void)
{
	start_rule("1");
	char *gone = map_far_pages(2, PROT_READ | PROT_WRITE);
	CHECK(munmap(gone, 2 * PAGE) == 0);
	REFUSED(ibv_reg_mr(pd, gone, 2 * PAGE, IBV_ACCESS_LOCAL_WRITE), EFAULT);
	REFUSED(ibv_reg_mr(pd, gone + 8, 16, 0), EFAULT);
	REFUSED(ibv_reg_mr_iova(pd, gone, PAGE, 0x1000, IBV_ACCESS_REMOTE_READ), EFAULT);
	REFUSED(ibv_reg_mr_iova2(pd, gone, PAGE, 0x1000, IBV_ACCESS_LOCAL_WRITE), EFAULT);
	REFUSED(ibv_reg_mr(pd, NULL, PAGE, IBV_ACCESS_LOCAL_WRITE), EFAULT);
	rule_ok("unmapped pages (and NULL): NULL with EFAULT");
}

static void rule_read_only(void)
{
	char *ro = map_far_pages(2, PROT_READ);

	start_rule("2");
	REFUSED(ibv_reg_mr(pd, ro, 2 * PAGE, IBV_ACCESS_LOCAL_WRITE), EFAULT);
	REFUSED(ibv_reg_mr(pd, ro, PAGE,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ),
		EFAULT);
	REFUSED(ibv_reg_mr_iova2(pd, ro + PAGE, 8, 0,
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC),
		EFAULT);
	rule_ok("a read-only mapping with write access: NULL with EFAULT");

	start_rule("3");
	struct ibv_mr *mr = ibv_reg_mr(pd, ro, 2 * PAGE, IBV_ACCESS_REMOTE_READ);
	CHECKF(mr != NULL, "ibv_reg_mr(read-only, REMOTE_READ)");
	CHECK(mr->addr == ro && mr->length == 2 * PAGE);
	struct ibv_mr *none = ibv_reg_mr(pd, ro + 100, 10, 0);
	CHECKF(none != NULL, "ibv_reg_mr(read-only, no access flags)");
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_dereg_mr(none) == 0);
	rule_ok("a read-only mapping without write access registers");

	CHECK(munmap(ro, 2 * PAGE) == 0);
}

static void rule_zero_length(void)
{
	start_rule("4");
	char *buf = malloc(64);
	CHECK(buf != NULL);
	REFUSED(ibv_reg_mr(pd, buf, 0, IBV_ACCESS_LOCAL_WRITE), EINVAL);
	REFUSED(ibv_reg_mr_iova2(pd, buf, 0, 0, 0), EINVAL);
	free(buf);
	rule_ok("length 0: NULL with EINVAL");
}

/* Whether the kernel would charge a registration to RLIMIT_MEMLOCK: a finite soft limit
 * and no CAP_IPC_LOCK in the effective set. */
static int memlock_applies(void)
{
	struct rlimit rl;
	CHECK(getrlimit(RLIMIT_MEMLOCK, &rl) == 0);
	if (rl.rlim_cur == RLIM_INFINITY)
		return 0;
	FILE *f = fopen("/proc/self/status", "r");
	CHECK(f != NULL);
	char line[256];
	unsigned long long caps = 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "CapEff: %llx", &caps) == 1)
			break;
	fclose(f);
	return !(caps & (1ULL << CAP_IPC_LOCK));
}

static void rule_one_tebibyte(void)
{
	start_rule("5");
	char *small = malloc(PAGE);
	CHECK(small != NULL);
	int expected = memlock_applies() ? ENOMEM : EFAULT;
	REFUSED(ibv_reg_mr(pd, small, 1ULL << 40, IBV_ACCESS_LOCAL_WRITE), expected);
	REFUSED(ibv_reg_mr(pd, small, 1ULL << 40, 0), expected);
	free(small);
	printf("(expected %s)\n", expected == ENOMEM ? "ENOMEM" : "EFAULT");
	rule_ok("1 TiB over a 4 KiB malloc: NULL with EFAULT (ENOMEM under RLIMIT_MEMLOCK)");
}

static struct ibv_qp *create_rc(struct ibv_cq *cq)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &attr);
	CHECKF(qp != NULL, "ibv_create_qp(RC)");
	return qp;
}

static void rule_write_into_unmapped(void)
{
	start_rule("6");
	struct ibv_cq *req_cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_cq *resp_cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(req_cq != NULL && resp_cq != NULL);
	struct ibv_qp *req = create_rc(req_cq);
	struct ibv_qp *resp = create_rc(resp_cq);
	connect_rc(req, resp->qp_num, &gid, IBV_ACCESS_REMOTE_WRITE);
	connect_rc(resp, req->qp_num, &gid, IBV_ACCESS_REMOTE_WRITE);

	char *src = malloc(PAGE);
	CHECK(src != NULL);
	memset(src, 0x5a, PAGE);
	struct ibv_mr *src_mr = ibv_reg_mr(pd, src, PAGE, 0);
	CHECKF(src_mr != NULL, "ibv_reg_mr(source)");

	char *target = map_far_pages(2, PROT_READ | PROT_WRITE);
	struct ibv_mr *target_mr = ibv_reg_mr(pd, target, 2 * PAGE,
					      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECKF(target_mr != NULL, "ibv_reg_mr(target)");
	/* Breaking ibv_reg_mr(3)'s contract on purpose: the pages go while registered. */
	CHECK(munmap(target, 2 * PAGE) == 0);

	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = 256, .lkey = src_mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 6,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
	};
	wr.wr.rdma.remote_addr = (uintptr_t)target + PAGE - 128;
	wr.wr.rdma.rkey = target_mr->rkey;
	struct ibv_send_wr *bad = NULL;
	CHECKF(ibv_post_send(req, &wr, &bad) == 0, "ibv_post_send(RDMA WRITE)");
	struct ibv_wc wc;
	int got = poll_until(req_cq, 1, &wc, WAIT_MS);
	CHECKF(got == 1, "expected a completion, ibv_poll_cq gave %d", got);
	CHECKF(wc.status == IBV_WC_REM_ACCESS_ERR && wc.wr_id == 6,
	       "wr_id %" PRIu64 ": status %s, expected IBV_WC_REM_ACCESS_ERR", wc.wr_id,
	       ibv_wc_status_str(wc.status));

	CHECK(ibv_dereg_mr(target_mr) == 0);
	CHECK(ibv_dereg_mr(src_mr) == 0);
	free(src);
	CHECK(ibv_destroy_qp(req) == 0);
	CHECK(ibv_destroy_qp(resp) == 0);
	CHECK(ibv_destroy_cq(req_cq) == 0);
	CHECK(ibv_destroy_cq(resp_cq) == 0);
	rule_ok("a peer's RDMA WRITE into a region unmapped while registered: "
		"IBV_WC_REM_ACCESS_ERR, the program lives");
}

static void rule_memlock(void)
{
	start_rule("7");
	struct __user_cap_header_struct header = { .version = _LINUX_CAPABILITY_VERSION_3,
						   .pid = 0 };
	struct __user_cap_data_struct data[2];
	CHECK(syscall(SYS_capget, &header, data) == 0);
	data[0].effective &= ~(1u << CAP_IPC_LOCK);
	CHECK(syscall(SYS_capset, &header, data) == 0);
	struct rlimit saved, low;
	CHECK(getrlimit(RLIMIT_MEMLOCK, &saved) == 0);
	low = saved;
	low.rlim_cur = 64 * 1024;
	CHECK(setrlimit(RLIMIT_MEMLOCK, &low) == 0);
	CHECK(memlock_applies());

	char *buf = map_far_pages(32, PROT_READ | PROT_WRITE);
	struct ibv_mr *half = ibv_reg_mr(pd, buf, 8 * PAGE, IBV_ACCESS_LOCAL_WRITE);
	CHECKF(half != NULL, "ibv_reg_mr(32 KiB) under a 64 KiB RLIMIT_MEMLOCK");
	REFUSED(ibv_reg_mr(pd, buf + 8 * PAGE, 16 * PAGE, IBV_ACCESS_LOCAL_WRITE), ENOMEM);
	/* A page-unaligned range pins every page it touches: 7 pages from byte 1 touch 8,
	 * 16 in all, exactly the limit. */
	struct ibv_mr *more = ibv_reg_mr(pd, buf + 8 * PAGE + 1, 7 * PAGE, 0);
	CHECKF(more != NULL, "ibv_reg_mr(8 pages) up to the limit");
	REFUSED(ibv_reg_mr(pd, buf, 1, 0), ENOMEM);
	CHECK(ibv_dereg_mr(half) == 0);
	CHECK(ibv_dereg_mr(more) == 0);
	struct ibv_mr *all = ibv_reg_mr(pd, buf, 16 * PAGE, IBV_ACCESS_LOCAL_WRITE);
	CHECKF(all != NULL, "ibv_reg_mr(64 KiB) once the others are deregistered");
	CHECK(ibv_dereg_mr(all) == 0);

	CHECK(setrlimit(RLIMIT_MEMLOCK, &saved) == 0);
	CHECK(munmap(buf, 32 * PAGE) == 0);
	rule_ok("past RLIMIT_MEMLOCK without CAP_IPC_LOCK: NULL with ENOMEM; "
		"deregistration gives the pages back");
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGALRM, watchdog);

	start_rule("setup");
	ctx = open_softverbs0();
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	rule_ok("device, PD");

	rule_unmapped();
	rule_read_only();
	rule_zero_length();
	rule_one_tebibyte();
	if (RUNNING_ON_VALGRIND) {
		printf("rule 6: skipped under valgrind\n");
	} else {
		rule_write_into_unmapped();
	}
	rule_memlock();

	start_rule("teardown");
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	rule_ok("everything freed");
	printf("ok %d checks\n", checks);
	return 0;
}
