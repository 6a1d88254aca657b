/*
 * IBA 1.5's ATOMIC WRITE on the drop-in, through the real inline verbs functions
 * (ibv_create_qp_ex, ibv_wr_start, ibv_wr_atomic_write, ibv_wr_complete, ibv_poll_cq,
 * ibv_query_device_ex).
 *
 * One process, one device (softverbs0), one PD. RC QP pairs are connected to each other
 * through the device (RoCEv2 address = GID index 0): `req` (ibv_create_qp_ex with
 * IBV_QP_EX_WITH_ATOMIC_WRITE) writes, `resp` (ibv_create_qp) grants remote write. A
 * remote error moves both QPs to the error state, so each rule that expects one has its
 * own pair.
 *
 *   1 ibv_query_device_ex(3): device_cap_flags_ex has the ATOMIC WRITE capability. The
 *     installed rdma-core 44 headers name no such bit, so the raw bit the kernel calls
 *     IB_UVERBS_DEVICE_ATOMIC_WRITE (1 << 40, rdma/ib_user_ioctl_verbs.h of Linux >= 6.2,
 *     as the drop-in's device.rs documents and rxe reports) is checked
 *   2 ibv_wr_post(3) ibv_wr_atomic_write (IBA 1.5): the 8 bytes of the wire buffer land at
 *     the 8-byte-aligned address exactly, the bytes around them are untouched, and the
 *     completion's opcode is IBV_WC_ATOMIC_WRITE
 *   3 ibv_wr_post(3) ibv_wr_atomic_write to a misaligned address (IBA 1.5: the address of
 *     an ATOMIC WRITE is 8-byte aligned; the responder NAKs an invalid request):
 *     IBV_WC_REM_INV_REQ_ERR, the memory untouched
 *   4 ibv_wr_flush (rdma-core 45's ibv_wr_post(3), IBA 1.5 RDMA FLUSH) on a QP created with
 *     IBV_QP_EX_WITH_FLUSH (the responder QP granting the flush access), to a region
 *     registered with IBV_ACCESS_FLUSH_GLOBAL: the global
 *     flush of a range and of the whole region (IBV_FLUSH_MR) complete with IBV_WC_FLUSH.
 *     The installed rdma-core 44 headers have neither ibv_wr_flush nor its constants: the
 *     program declares rdma-core 45's struct ibv_qp_ex (44's, then wr_flush) and values,
 *     as a program built against newer headers sees them
 *   5 ibv_wr_flush of the persistent placement to a region registered without
 *     IBV_ACCESS_FLUSH_PERSISTENT: IBV_WC_REM_ACCESS_ERR (IBA 1.5: the responder checks
 *     the flush access of the region)
 *
 * Prints one "rule N: ...: ok" line per rule and "ok <checks> checks" at the end; exits 1
 * with "FAIL rule N" on stderr at the first failed check. Every wait is bounded.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "rules.h"

/* IB_UVERBS_DEVICE_ATOMIC_WRITE of Linux >= 6.2; not in rdma-core 44's headers. */
#define DEVICE_ATOMIC_WRITE (1ULL << 40)

/* rdma-core 45's verbs.h, which the installed rdma-core 44 predates. */
#define QP_EX_WITH_FLUSH (1ULL << 11) /* IBV_QP_EX_WITH_FLUSH */
#define ACCESS_FLUSH_GLOBAL (1 << 8)  /* IBV_ACCESS_FLUSH_GLOBAL */
#define ACCESS_FLUSH_PERSISTENT (1 << 9) /* IBV_ACCESS_FLUSH_PERSISTENT */
/* A responder QP takes FLUSH only when it grants it (rxe's check_op_valid). */
#define QP_FLUSH_ACCESS (IBV_ACCESS_REMOTE_WRITE | ACCESS_FLUSH_GLOBAL | ACCESS_FLUSH_PERSISTENT)
#define FLUSH_GLOBAL 1                /* IBV_FLUSH_GLOBAL */
#define FLUSH_PERSISTENT 2            /* IBV_FLUSH_PERSISTENT */
#define FLUSH_RANGE 0                 /* IBV_FLUSH_RANGE */
#define FLUSH_MR 1                    /* IBV_FLUSH_MR */
#define WC_FLUSH 8                    /* IBV_WC_FLUSH */
struct qp_ex_45 {
	struct ibv_qp_ex ex;
	void (*wr_flush)(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr, size_t len,
			 uint8_t type, uint8_t level);
};

static void rule_ok(const char *what)
{
	alarm(0);
	printf("rule %s: %s: ok\n", rule, what);
	fflush(stdout);
}

static struct ibv_wc expect_one(struct ibv_cq *cq, enum ibv_wc_status status, uint64_t wr_id)
{
	struct ibv_wc wc;
	int got = poll_until(cq, 1, &wc, WAIT_MS);
	CHECKF(got == 1, "expected a completion (status %s), ibv_poll_cq gave %d",
	       ibv_wc_status_str(status), got);
	CHECKF(wc.status == status, "wr_id %" PRIu64 ": status %s, expected %s", wc.wr_id,
	       ibv_wc_status_str(wc.status), ibv_wc_status_str(status));
	CHECKF(wc.wr_id == wr_id, "wr_id %" PRIu64 ", expected %" PRIu64, wc.wr_id, wr_id);
	return wc;
}

#define REGION 4096

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static unsigned char *target;
static struct ibv_mr *target_mr;

struct pair {
	struct ibv_qp *req, *resp;
	struct ibv_qp_ex *req_ex;
	struct ibv_cq *req_cq, *resp_cq;
};

static struct pair make_pair_with(uint64_t send_ops, unsigned int access);

static struct pair make_pair(void)
{
	return make_pair_with(IBV_QP_EX_WITH_ATOMIC_WRITE, IBV_ACCESS_REMOTE_WRITE);
}

static struct pair make_pair_with(uint64_t send_ops, unsigned int access)
{
	struct pair p;
	struct ibv_qp_cap cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
				  .max_recv_sge = 1 };
	p.req_cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	p.resp_cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(p.req_cq != NULL && p.resp_cq != NULL);
	struct ibv_qp_init_attr_ex ex = {
		.send_cq = p.req_cq,
		.recv_cq = p.req_cq,
		.cap = cap,
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = send_ops,
	};
	p.req = ibv_create_qp_ex(ctx, &ex);
	CHECKF(p.req != NULL, "ibv_create_qp_ex(RC, send_ops_flags %#" PRIx64 ")", send_ops);
	p.req_ex = ibv_qp_to_qp_ex(p.req);
	CHECK(p.req_ex != NULL);
	struct ibv_qp_init_attr attr = { .send_cq = p.resp_cq, .recv_cq = p.resp_cq, .cap = cap,
					 .qp_type = IBV_QPT_RC, .sq_sig_all = 1 };
	p.resp = ibv_create_qp(pd, &attr);
	CHECKF(p.resp != NULL, "ibv_create_qp(RC)");
	connect_rc(p.req, p.resp->qp_num, &gid, access);
	connect_rc(p.resp, p.req->qp_num, &gid, access);
	return p;
}

static void destroy_pair(struct pair p)
{
	CHECK(ibv_destroy_qp(p.req) == 0);
	CHECK(ibv_destroy_qp(p.resp) == 0);
	CHECK(ibv_destroy_cq(p.req_cq) == 0);
	CHECK(ibv_destroy_cq(p.resp_cq) == 0);
}

/* One ATOMIC WRITE of `wire` (8 bytes) to `addr` by the qp_ex builders. */
static void post_atomic_write(struct pair *p, uint64_t wr_id, uint64_t addr,
			      const unsigned char wire[8])
{
	CHECK(p->req_ex->wr_atomic_write != NULL);
	ibv_wr_start(p->req_ex);
	p->req_ex->wr_id = wr_id;
	p->req_ex->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(p->req_ex, target_mr->rkey, addr, wire);
	CHECKF(ibv_wr_complete(p->req_ex) == 0, "ibv_wr_complete(ibv_wr_atomic_write)");
}

static void rule_capability(void)
{
	start_rule("1");
	struct ibv_device_attr_ex attr;
	memset(&attr, 0, sizeof(attr));
	CHECK(ibv_query_device_ex(ctx, NULL, &attr) == 0);
	CHECKF(attr.device_cap_flags_ex & DEVICE_ATOMIC_WRITE,
	       "device_cap_flags_ex %#" PRIx64 " without bit 40 (ATOMIC_WRITE)",
	       (uint64_t)attr.device_cap_flags_ex);
	rule_ok("ibv_query_device_ex(3): device_cap_flags_ex has the ATOMIC WRITE bit (1 << 40)");
}

static void rule_lands(void)
{
	start_rule("2");
	struct pair p = make_pair();
	memset(target, 0xee, 64);
	const unsigned char wire[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	post_atomic_write(&p, 21, (uintptr_t)(target + 16), wire);
	struct ibv_wc wc = expect_one(p.req_cq, IBV_WC_SUCCESS, 21);
	CHECKF(wc.opcode == IBV_WC_ATOMIC_WRITE, "opcode %d, expected IBV_WC_ATOMIC_WRITE",
	       wc.opcode);
	CHECK(memcmp(target + 16, wire, 8) == 0);
	for (int i = 0; i < 64; i++)
		if (i < 16 || i >= 24)
			CHECKF(target[i] == 0xee, "byte %d changed to %#x", i, target[i]);
	destroy_pair(p);
	rule_ok("ibv_wr_atomic_write: the 8 bytes land exactly, IBV_WC_ATOMIC_WRITE");
}

static void rule_misaligned(void)
{
	start_rule("3");
	struct pair p = make_pair();
	memset(target, 0x5a, 64);
	const unsigned char wire[8] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };
	post_atomic_write(&p, 31, (uintptr_t)(target + 4), wire);
	expect_one(p.req_cq, IBV_WC_REM_INV_REQ_ERR, 31);
	for (int i = 0; i < 64; i++)
		CHECKF(target[i] == 0x5a, "byte %d changed to %#x", i, target[i]);
	destroy_pair(p);
	rule_ok("ibv_wr_atomic_write to a misaligned address: IBV_WC_REM_INV_REQ_ERR");
}

/* One FLUSH through rdma-core 45's builder. */
static void post_flush(struct pair *p, uint64_t wr_id, struct ibv_mr *mr, uint64_t addr,
		       size_t len, uint8_t type, uint8_t level)
{
	struct qp_ex_45 *qpx = (struct qp_ex_45 *)p->req_ex;
	CHECKF(qpx->wr_flush != NULL, "wr_flush of a QP created with IBV_QP_EX_WITH_FLUSH");
	ibv_wr_start(p->req_ex);
	p->req_ex->wr_id = wr_id;
	p->req_ex->wr_flags = IBV_SEND_SIGNALED;
	qpx->wr_flush(p->req_ex, mr->rkey, addr, len, type, level);
	CHECKF(ibv_wr_complete(p->req_ex) == 0, "ibv_wr_complete(ibv_wr_flush)");
}

/* A pair whose requester builds FLUSH and whose responder grants it, and the target
 * region registered again with IBV_ACCESS_FLUSH_GLOBAL (not _PERSISTENT). */
static struct pair flush_pair(struct ibv_mr **mr)
{
	struct pair p = make_pair_with(QP_EX_WITH_FLUSH, QP_FLUSH_ACCESS);
	*mr = ibv_reg_mr(pd, target, REGION,
			 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | ACCESS_FLUSH_GLOBAL);
	CHECKF(*mr != NULL, "ibv_reg_mr(IBV_ACCESS_FLUSH_GLOBAL)");
	return p;
}

static void rule_flush(void)
{
	start_rule("4");
	struct ibv_mr *mr;
	struct pair p = flush_pair(&mr);
	post_flush(&p, 41, mr, (uintptr_t)target, 256, FLUSH_GLOBAL, FLUSH_RANGE);
	struct ibv_wc wc = expect_one(p.req_cq, IBV_WC_SUCCESS, 41);
	CHECKF(wc.opcode == WC_FLUSH, "opcode %d, expected IBV_WC_FLUSH (8)", wc.opcode);
	post_flush(&p, 42, mr, 0, 0, FLUSH_GLOBAL, FLUSH_MR);
	wc = expect_one(p.req_cq, IBV_WC_SUCCESS, 42);
	CHECKF(wc.opcode == WC_FLUSH, "opcode %d, expected IBV_WC_FLUSH (8)", wc.opcode);
	CHECK(ibv_dereg_mr(mr) == 0);
	destroy_pair(p);
	rule_ok("ibv_wr_flush (rdma-core 45), global placement, a range and the whole region: "
		"IBV_WC_FLUSH");
}

static void rule_flush_refused(void)
{
	start_rule("5");
	struct ibv_mr *mr;
	struct pair p = flush_pair(&mr);
	post_flush(&p, 51, mr, (uintptr_t)target, 64, FLUSH_PERSISTENT, FLUSH_RANGE);
	expect_one(p.req_cq, IBV_WC_REM_ACCESS_ERR, 51);
	CHECK(ibv_dereg_mr(mr) == 0);
	destroy_pair(p);
	rule_ok("ibv_wr_flush, persistent placement, region without IBV_ACCESS_FLUSH_PERSISTENT: "
		"IBV_WC_REM_ACCESS_ERR");
}

int main(void)
{
	signal(SIGALRM, watchdog);
	setvbuf(stdout, NULL, _IOLBF, 0);
	start_rule("setup");
	ctx = open_softverbs0();
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	target = aligned_alloc(4096, REGION);
	CHECK(target != NULL);
	memset(target, 0, REGION);
	target_mr = ibv_reg_mr(pd, target, REGION,
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECKF(target_mr != NULL, "ibv_reg_mr");
	rule_ok("a device, a region with remote write");

	rule_capability();
	rule_lands();
	rule_misaligned();
	rule_flush();
	rule_flush_refused();

	start_rule("teardown");
	CHECK(ibv_dereg_mr(target_mr) == 0);
	free(target);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	rule_ok("everything freed");
	printf("ok %d checks\n", checks);
	return 0;
}
