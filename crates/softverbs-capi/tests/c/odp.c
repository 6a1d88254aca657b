/*
 * On-demand paging on the drop-in: ibv_reg_mr(3) with IBV_ACCESS_ON_DEMAND,
 * ibv_advise_mr(3), and ibv_query_device_ex(3)'s odp_caps.
 *
 *   1 ibv_query_device_ex: odp_caps.general_caps is IBV_ODP_SUPPORT |
 *     IBV_ODP_SUPPORT_IMPLICIT; RC reports send, receive, write, read, atomic and SRQ
 *     receive, UD send, receive and SRQ receive (rxe's rxe_init_device_param), UC send,
 *     receive, write and SRQ receive
 *   2 an ODP registration of a PROT_NONE range and of a range not mapped at all succeeds
 *     (ibv_reg_mr, ibv_reg_mr_iova2): nothing is pinned or touched (the kernel's
 *     ib_umem_odp_get); the same ranges without ON_DEMAND are NULL with EFAULT
 *   3 memory mapped after the registration is reached: a peer's RDMA WRITE lands in the
 *     pages mprotect'ed readable and writable, and in pages mmap'ed where nothing was
 *   4 (not under valgrind, whose memcheck reports the device's store into an unmapped
 *     page itself) a page still unmapped when the access comes: a peer's RDMA WRITE
 *     completes with IBV_WC_REM_ACCESS_ERR (rxe: rxe_odp_map_range_and_lock's EFAULT,
 *     RESPST_ERR_RKEY_VIOLATION), a local SGE naming it with IBV_WC_LOC_PROT_ERR; the
 *     program lives, and once the page is mapped a WRITE on a fresh QP pair lands
 *   5 implicit ODP (ibv_reg_mr(3): "addr should be 0 and length should be SIZE_MAX"):
 *     succeeds with ON_DEMAND, mr->addr NULL and mr->length SIZE_MAX, and its rkey
 *     reaches any mapped address; without ON_DEMAND NULL with EINVAL; with an iova
 *     (ibv_reg_mr_iova2) NULL with EINVAL (rxe_odp_mr_init_user)
 *   6 ibv_advise_mr: 0 for the three prefetches of an ODP range, with and without
 *     IBV_ADVISE_MR_FLAG_FLUSH, and for an empty list; EINVAL for unknown flags,
 *     EOPNOTSUPP for an unknown advice, ENOENT for an lkey of a region without
 *     ON_DEMAND, EPERM for a region of another PD and for PREFETCH_WRITE of a region not
 *     registered for writing, EFAULT (with FLUSH) for a range outside the region and
 *     (not under valgrind) for a page that is not mapped (ibv_advise_mr(3); the kernel's
 *     ib_uverbs_advise_mr, mlx5's get_prefetchable_mr and pagefault_mr)
 *
 * Prints one "rule N ... ok" line per rule and "ok <checks> checks" at the end; exits 1
 * with "FAIL rule N (...)" on stderr at the first failed check.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <valgrind/valgrind.h>

#include "rules.h"

#define PAGE 4096
#define RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define ODP_RW (RW | IBV_ACCESS_ON_DEMAND)

static void rule_ok(const char *what)
{
	alarm(0);
	printf("rule %s: %s: ok\n", rule, what);
	fflush(stdout);
}

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static char *src;
static struct ibv_mr *src_mr;

#define REFUSED(call, expected)                                                        \
	do {                                                                          \
		errno = 0;                                                            \
		struct ibv_mr *refused_mr = (call);                                   \
		CHECKF(refused_mr == NULL && errno == (expected),                     \
		       "%s: expected NULL with errno %d (%s)", #call, (expected),     \
		       strerror(expected));                                           \
	} while (0)

/* Maps `pages` read-write pages exactly at `at`, where nothing is mapped. */
static void map_at(void *at, size_t pages)
{
	void *p = mmap(at, pages * PAGE, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	CHECKF(p == at, "mmap at %p", at);
}

struct pair {
	struct ibv_cq *cq;
	struct ibv_qp *req, *resp;
};

static struct pair connected_pair(void)
{
	struct pair p;
	p.cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(p.cq != NULL);
	struct ibv_qp_init_attr attr = { .send_cq = p.cq, .recv_cq = p.cq,
					 .cap = { .max_send_wr = 4, .max_recv_wr = 4,
						  .max_send_sge = 1, .max_recv_sge = 1 },
					 .qp_type = IBV_QPT_RC, .sq_sig_all = 1 };
	p.req = ibv_create_qp(pd, &attr);
	p.resp = ibv_create_qp(pd, &attr);
	CHECK(p.req != NULL && p.resp != NULL);
	connect_rc(p.req, p.resp->qp_num, &gid, IBV_ACCESS_REMOTE_WRITE);
	connect_rc(p.resp, p.req->qp_num, &gid, IBV_ACCESS_REMOTE_WRITE);
	return p;
}

static void destroy_pair(struct pair p)
{
	CHECK(ibv_destroy_qp(p.req) == 0);
	CHECK(ibv_destroy_qp(p.resp) == 0);
	CHECK(ibv_destroy_cq(p.cq) == 0);
}

/* Posts an RDMA WRITE of `len` bytes from `local` (lkey) to `remote` (rkey) on p.req and
 * returns its completion status. */
static enum ibv_wc_status write_status(struct pair p, const void *local, uint32_t lkey,
				       uint64_t remote, uint32_t rkey, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE }, *bad = NULL;
	wr.wr.rdma.remote_addr = remote;
	wr.wr.rdma.rkey = rkey;
	CHECK(ibv_post_send(p.req, &wr, &bad) == 0);
	struct ibv_wc wc;
	int got = poll_until(p.cq, 1, &wc, WAIT_MS);
	CHECKF(got == 1, "expected a completion, ibv_poll_cq gave %d", got);
	CHECK(wc.wr_id == 7);
	return wc.status;
}

static void rule_caps(void)
{
	start_rule("1");
	struct ibv_device_attr_ex attr;
	memset(&attr, 0xff, sizeof(attr));
	CHECK(ibv_query_device_ex(ctx, NULL, &attr) == 0);
	CHECKF(attr.odp_caps.general_caps == (IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT),
	       "general_caps %#" PRIx64, attr.odp_caps.general_caps);
	uint32_t rc = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
		      IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
	uint32_t uc = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
		      IBV_ODP_SUPPORT_SRQ_RECV;
	uint32_t ud = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;
	CHECK(attr.odp_caps.per_transport_caps.rc_odp_caps == rc);
	CHECK(attr.odp_caps.per_transport_caps.uc_odp_caps == uc);
	CHECK(attr.odp_caps.per_transport_caps.ud_odp_caps == ud);
	CHECK(attr.xrc_odp_caps == 0);
	rule_ok("odp_caps: ODP and implicit ODP; RC, UC, UD operations");
}

static char *protected_range, *unmapped_range;
static struct ibv_mr *protected_mr, *unmapped_mr;

static void rule_register_unmapped(void)
{
	start_rule("2");
	protected_range = map_far_pages(2, PROT_NONE);
	unmapped_range = map_far_pages(2, PROT_READ | PROT_WRITE);
	CHECK(munmap(unmapped_range, 2 * PAGE) == 0);
	REFUSED(ibv_reg_mr(pd, protected_range, 2 * PAGE, RW), EFAULT);
	REFUSED(ibv_reg_mr(pd, unmapped_range, 2 * PAGE, RW), EFAULT);
	protected_mr = ibv_reg_mr(pd, protected_range, 2 * PAGE, ODP_RW);
	CHECKF(protected_mr != NULL, "ibv_reg_mr(PROT_NONE, ON_DEMAND)");
	unmapped_mr = ibv_reg_mr_iova2(pd, unmapped_range, 2 * PAGE, (uintptr_t)unmapped_range,
				       ODP_RW);
	CHECKF(unmapped_mr != NULL, "ibv_reg_mr_iova2(not mapped, ON_DEMAND)");
	CHECK(protected_mr->addr == protected_range && protected_mr->length == 2 * PAGE);
	rule_ok("ON_DEMAND registers ranges not mapped (PROT_NONE, or nothing); "
		"without it EFAULT");
}

static void rule_mapped_later(void)
{
	start_rule("3");
	CHECK(mprotect(protected_range, 2 * PAGE, PROT_READ | PROT_WRITE) == 0);
	map_at(unmapped_range, 2);
	struct pair p = connected_pair();
	memset(src, 0x3c, 256);
	CHECK(write_status(p, src, src_mr->lkey, (uintptr_t)protected_range + PAGE - 128,
			   protected_mr->rkey, 256) == IBV_WC_SUCCESS);
	CHECK(protected_range[PAGE - 128] == 0x3c && protected_range[PAGE + 127] == 0x3c);
	CHECK(write_status(p, src, src_mr->lkey, (uintptr_t)unmapped_range + 64,
			   unmapped_mr->rkey, 64) == IBV_WC_SUCCESS);
	CHECK(unmapped_range[64] == 0x3c && unmapped_range[127] == 0x3c &&
	      unmapped_range[128] == 0);
	destroy_pair(p);
	rule_ok("memory mapped after an ODP registration: a peer's RDMA WRITE lands");
}

static void rule_still_unmapped(void)
{
	start_rule("4");
	CHECK(munmap(unmapped_range + PAGE, PAGE) == 0);
	struct pair p = connected_pair();
	enum ibv_wc_status status = write_status(p, src, src_mr->lkey,
						 (uintptr_t)unmapped_range + PAGE, unmapped_mr->rkey,
						 64);
	CHECKF(status == IBV_WC_REM_ACCESS_ERR, "status %s, expected IBV_WC_REM_ACCESS_ERR",
	       ibv_wc_status_str(status));
	destroy_pair(p);

	/* The local side: an SGE in the unmapped page of an ODP region, written to a pinned
	 * peer region. */
	p = connected_pair();
	status = write_status(p, unmapped_range + PAGE, unmapped_mr->lkey,
			      (uintptr_t)protected_range, protected_mr->rkey, 64);
	CHECKF(status == IBV_WC_LOC_PROT_ERR, "status %s, expected IBV_WC_LOC_PROT_ERR",
	       ibv_wc_status_str(status));
	destroy_pair(p);

	map_at(unmapped_range + PAGE, 1);
	p = connected_pair();
	CHECK(write_status(p, src, src_mr->lkey, (uintptr_t)unmapped_range + PAGE,
			   unmapped_mr->rkey, 64) == IBV_WC_SUCCESS);
	CHECK(unmapped_range[PAGE] == 0x3c);
	destroy_pair(p);
	rule_ok("a page still unmapped: IBV_WC_REM_ACCESS_ERR / IBV_WC_LOC_PROT_ERR, the "
		"program lives, and the region reaches the page once it is mapped");
}

static void rule_implicit(void)
{
	start_rule("5");
	REFUSED(ibv_reg_mr(pd, NULL, SIZE_MAX, RW), EINVAL);
	REFUSED(ibv_reg_mr_iova2(pd, NULL, SIZE_MAX, 4096, ODP_RW), EINVAL);
	struct ibv_mr *all = ibv_reg_mr(pd, NULL, SIZE_MAX, ODP_RW);
	CHECKF(all != NULL, "ibv_reg_mr(NULL, SIZE_MAX, ON_DEMAND)");
	CHECK(all->addr == NULL && all->length == SIZE_MAX);
	char *target = calloc(1, 256);
	CHECK(target != NULL);
	struct pair p = connected_pair();
	memset(src, 0x71, 32);
	CHECK(write_status(p, src, src_mr->lkey, (uintptr_t)target + 16, all->rkey, 32) ==
	      IBV_WC_SUCCESS);
	CHECK(target[15] == 0 && target[16] == 0x71 && target[47] == 0x71 && target[48] == 0);
	destroy_pair(p);
	free(target);
	CHECK(ibv_dereg_mr(all) == 0);
	rule_ok("implicit ODP (NULL, SIZE_MAX) only with ON_DEMAND and iova 0; it reaches "
		"any mapped address");
}

static void rule_advise(void)
{
	start_rule("6");
	struct ibv_sge sge = { .addr = (uintptr_t)unmapped_range, .length = 2 * PAGE,
			       .lkey = unmapped_mr->lkey };
	int advices[] = { IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
			  IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT };
	for (int i = 0; i < 3; i++) {
		CHECK(ibv_advise_mr(pd, advices[i], IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1) == 0);
		CHECK(ibv_advise_mr(pd, advices[i], 0, &sge, 1) == 0);
	}
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, NULL, 0) == 0);
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 1 << 4, &sge, 1) == EINVAL);
	CHECK(ibv_advise_mr(pd, 7, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1) == EOPNOTSUPP);

	struct ibv_sge pinned = { .addr = (uintptr_t)src, .length = 64, .lkey = src_mr->lkey };
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &pinned,
			    1) == ENOENT);
	struct ibv_pd *other = ibv_alloc_pd(ctx);
	CHECK(other != NULL);
	CHECK(ibv_advise_mr(other, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &sge,
			    1) == EPERM);
	CHECK(ibv_dealloc_pd(other) == 0);
	char *ro = map_far_pages(1, PROT_READ);
	struct ibv_mr *ro_mr = ibv_reg_mr(pd, ro, PAGE, IBV_ACCESS_ON_DEMAND);
	CHECK(ro_mr != NULL);
	struct ibv_sge ro_sge = { .addr = (uintptr_t)ro, .length = PAGE, .lkey = ro_mr->lkey };
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH,
			    &ro_sge, 1) == EPERM);
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &ro_sge,
			    1) == 0);
	CHECK(ibv_dereg_mr(ro_mr) == 0);
	CHECK(munmap(ro, PAGE) == 0);

	struct ibv_sge outside = { .addr = (uintptr_t)unmapped_range + PAGE, .length = 2 * PAGE,
				   .lkey = unmapped_mr->lkey };
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH,
			    &outside, 1) == EFAULT);
	if (!RUNNING_ON_VALGRIND) {
		CHECK(munmap(unmapped_range + PAGE, PAGE) == 0);
		struct ibv_sge hole = { .addr = (uintptr_t)unmapped_range + PAGE, .length = 8,
					.lkey = unmapped_mr->lkey };
		CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH,
				    &hole, 1) == EFAULT);
		CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &hole, 1) == 0);
		CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT,
				    IBV_ADVISE_MR_FLAG_FLUSH, &hole, 1) == 0);
		map_at(unmapped_range + PAGE, 1);
	}
	rule_ok("ibv_advise_mr: 0 for prefetches of ODP ranges; EINVAL, EOPNOTSUPP, ENOENT, "
		"EPERM, EFAULT as the kernel");
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
	src = aligned_alloc(PAGE, PAGE);
	CHECK(src != NULL);
	memset(src, 0, PAGE);
	src_mr = ibv_reg_mr(pd, src, PAGE, IBV_ACCESS_LOCAL_WRITE);
	CHECK(src_mr != NULL);
	rule_ok("device, PD, a source region");

	rule_caps();
	rule_register_unmapped();
	rule_mapped_later();
	if (RUNNING_ON_VALGRIND)
		printf("rule 4: skipped under valgrind\n");
	else
		rule_still_unmapped();
	rule_implicit();
	rule_advise();

	start_rule("teardown");
	CHECK(ibv_dereg_mr(protected_mr) == 0);
	CHECK(ibv_dereg_mr(unmapped_mr) == 0);
	CHECK(ibv_dereg_mr(src_mr) == 0);
	free(src);
	CHECK(munmap(protected_range, 2 * PAGE) == 0);
	CHECK(munmap(unmapped_range, 2 * PAGE) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	rule_ok("everything destroyed");
	printf("ok %d checks\n", checks);
	return 0;
}
