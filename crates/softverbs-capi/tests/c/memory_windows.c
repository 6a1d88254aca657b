/*
 * Memory windows on the drop-in, through the real inline verbs functions (ibv_alloc_mw,
 * ibv_bind_mw, ibv_post_send, ibv_wr_bind_mw, ibv_poll_cq): a window's R_Key reaches its
 * range of a region with its own rights, and nothing beyond (IBTA vol. 1 10.6.7).
 *
 * One process, one device (softverbs0), one PD. RC QP pairs are connected to each other
 * through the device (RoCEv2 address = GID index 0): `req` (ibv_create_qp) makes the
 * remote accesses, `resp` (ibv_create_qp_ex with the bind, local-invalidate and
 * send-with-invalidate builders) binds the windows over its region. A remote access error
 * moves both QPs to the error state, so each rule that expects one has its own pair.
 *
 *   1 ibv_alloc_mw(3): a type other than IBV_MW_TYPE_1 / _2 is NULL with EINVAL; both
 *     types allocate, with their type and PD
 *   2 ibv_bind_mw(3), type 1: completes IBV_WC_BIND_MW, mw->rkey becomes the next key
 *     (ibv_inc_rkey); remote READ and WRITE inside the window through it succeed and land
 *     on the region's bytes; a WRITE crossing the window's end is IBV_WC_REM_ACCESS_ERR
 *     and leaves the bytes past the window unchanged
 *   3 ibv_bind_mw(3): a type 2 window is EINVAL at the call; a bind to a region registered
 *     without IBV_ACCESS_MW_BIND completes IBV_WC_MW_BIND_ERR, and so does a range beyond
 *     the region's end
 *   4 ibv_post_send(3) IBV_WR_BIND_MW, type 2: a READ through it succeeds, a READ past its
 *     end is IBV_WC_REM_ACCESS_ERR
 *   5 ibv_post_send(3) IBV_WR_LOCAL_INV: the window's R_Key is refused afterwards
 *     (IBV_WC_REM_ACCESS_ERR)
 *   6 ibv_wr_bind_mw (ibv_wr_post(3)), type 2, then the peer's IBV_WR_SEND_WITH_INV naming
 *     its R_Key: the receive completion has IBV_WC_WITH_INV and invalidated_rkey, and a
 *     WRITE through the key afterwards is IBV_WC_REM_ACCESS_ERR
 *   7 ibv_dereg_mr(3) of a region a window is bound to: EINVAL (it fails "if any memory
 *     window is still bound to this MR"); ibv_dealloc_pd(3) of a PD holding a window:
 *     EBUSY; after ibv_dealloc_mw both succeed
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

#define REGION 8192
/* The windows cover [WIN, WIN + WIN_LEN) of the responder's region. */
#define WIN 1024
#define WIN_LEN 1024
#define MW_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND)
#define REMOTE_RW (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
/* The requester's buffer, the responder's bindable region, and one without MW_BIND. */
static char *local, *target, *plain;
static struct ibv_mr *local_mr, *target_mr, *plain_mr;

static struct ibv_mr *region(char **buf, int access)
{
	*buf = aligned_alloc(4096, REGION);
	CHECK(*buf != NULL);
	memset(*buf, 0, REGION);
	struct ibv_mr *mr = ibv_reg_mr(pd, *buf, REGION, access);
	CHECKF(mr != NULL, "ibv_reg_mr");
	return mr;
}

struct pair {
	struct ibv_qp *req, *resp;
	struct ibv_qp_ex *resp_ex;
	struct ibv_cq *req_cq, *resp_cq;
};

static struct pair make_pair(void)
{
	struct pair p;
	struct ibv_qp_cap cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
				  .max_recv_sge = 1 };
	p.req_cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	p.resp_cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(p.req_cq != NULL && p.resp_cq != NULL);
	struct ibv_qp_init_attr attr = { .send_cq = p.req_cq, .recv_cq = p.req_cq, .cap = cap,
					 .qp_type = IBV_QPT_RC, .sq_sig_all = 1 };
	p.req = ibv_create_qp(pd, &attr);
	CHECKF(p.req != NULL, "ibv_create_qp(RC)");
	struct ibv_qp_init_attr_ex ex = {
		.send_cq = p.resp_cq,
		.recv_cq = p.resp_cq,
		.cap = cap,
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW |
				  IBV_QP_EX_WITH_LOCAL_INV,
	};
	p.resp = ibv_create_qp_ex(ctx, &ex);
	CHECKF(p.resp != NULL, "ibv_create_qp_ex(RC)");
	p.resp_ex = ibv_qp_to_qp_ex(p.resp);
	CHECK(p.resp_ex != NULL);
	connect_rc(p.req, p.resp->qp_num, &gid, REMOTE_RW);
	connect_rc(p.resp, p.req->qp_num, &gid, REMOTE_RW);
	return p;
}

static void destroy_pair(struct pair p)
{
	CHECK(ibv_destroy_qp(p.req) == 0);
	CHECK(ibv_destroy_qp(p.resp) == 0);
	CHECK(ibv_destroy_cq(p.req_cq) == 0);
	CHECK(ibv_destroy_cq(p.resp_cq) == 0);
}

/* An RDMA READ or WRITE of `len` bytes between local+off and remote address `addr`. */
static void post_rdma(struct pair *p, enum ibv_wr_opcode op, uint64_t wr_id, uint32_t off,
		      uint32_t len, uint64_t addr, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(local + off), .length = len,
			       .lkey = local_mr->lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	wr.wr.rdma.remote_addr = addr;
	wr.wr.rdma.rkey = rkey;
	CHECKF(ibv_post_send(p->req, &wr, &bad) == 0, "ibv_post_send(RDMA)");
}

/* A type 1 bind of [WIN, WIN + WIN_LEN) of `mr` by ibv_bind_mw on `qp`. */
static int bind_type_1(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mr *mr, uint64_t wr_id,
		       uint64_t addr, uint64_t len)
{
	struct ibv_mw_bind bind = {
		.wr_id = wr_id,
		.send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = mr, .addr = addr, .length = len,
			       .mw_access_flags = REMOTE_RW },
	};
	return ibv_bind_mw(qp, mw, &bind);
}

/* A type 2 bind by ibv_post_send IBV_WR_BIND_MW of [WIN, WIN + WIN_LEN) of target_mr. */
static uint32_t post_bind_type_2(struct pair *p, struct ibv_mw *mw, uint64_t wr_id)
{
	uint32_t rkey = ibv_inc_rkey(mw->rkey);
	struct ibv_send_wr wr = { .wr_id = wr_id, .opcode = IBV_WR_BIND_MW,
				  .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info.mr = target_mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)(target + WIN);
	wr.bind_mw.bind_info.length = WIN_LEN;
	wr.bind_mw.bind_info.mw_access_flags = REMOTE_RW;
	CHECKF(ibv_post_send(p->resp, &wr, &bad) == 0, "ibv_post_send(IBV_WR_BIND_MW)");
	expect_one(p->resp_cq, IBV_WC_SUCCESS, wr_id);
	return rkey;
}

static void rule_alloc(void)
{
	start_rule("1");
	errno = 0;
	CHECK(ibv_alloc_mw(pd, (enum ibv_mw_type)7) == NULL);
	CHECKF(errno == EINVAL, "ibv_alloc_mw(type 7): errno %d", errno);
	struct ibv_mw *one = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	struct ibv_mw *two = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(one != NULL && two != NULL);
	CHECK(one->type == IBV_MW_TYPE_1 && two->type == IBV_MW_TYPE_2);
	CHECK(one->pd == pd && two->pd == pd && one->rkey != two->rkey);
	CHECK(ibv_dealloc_mw(one) == 0 && ibv_dealloc_mw(two) == 0);
	rule_ok("ibv_alloc_mw(3): a bad type is EINVAL, types 1 and 2 allocate");
}

static void rule_type_1(void)
{
	start_rule("2");
	struct pair p = make_pair();
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	CHECK(mw != NULL);
	uint32_t before = mw->rkey;
	CHECK(bind_type_1(p.resp, mw, target_mr, 21, (uintptr_t)(target + WIN), WIN_LEN) == 0);
	CHECKF(mw->rkey == ibv_inc_rkey(before), "mw->rkey %#x after a bind of %#x", mw->rkey,
	       before);
	struct ibv_wc wc = expect_one(p.resp_cq, IBV_WC_SUCCESS, 21);
	CHECK(wc.opcode == IBV_WC_BIND_MW);
	uint64_t base = (uintptr_t)(target + WIN);
	memset(local, 0x3c, 64);
	post_rdma(&p, IBV_WR_RDMA_WRITE, 22, 0, 64, base + 16, mw->rkey);
	expect_one(p.req_cq, IBV_WC_SUCCESS, 22);
	CHECK(target[WIN + 16] == 0x3c && target[WIN + 79] == 0x3c);
	post_rdma(&p, IBV_WR_RDMA_READ, 23, 256, 64, base + 16, mw->rkey);
	expect_one(p.req_cq, IBV_WC_SUCCESS, 23);
	CHECK(local[256] == 0x3c && local[319] == 0x3c);
	post_rdma(&p, IBV_WR_RDMA_WRITE, 24, 0, 64, base + WIN_LEN - 32, mw->rkey);
	expect_one(p.req_cq, IBV_WC_REM_ACCESS_ERR, 24);
	CHECK(target[WIN + WIN_LEN] == 0 && target[WIN + WIN_LEN + 31] == 0);
	CHECK(ibv_dealloc_mw(mw) == 0);
	destroy_pair(p);
	memset(target, 0, REGION);
	rule_ok("ibv_bind_mw(3) type 1: inside the window READ and WRITE succeed, beyond it "
		"IBV_WC_REM_ACCESS_ERR");
}

static void rule_bind_errors(void)
{
	start_rule("3");
	struct pair p = make_pair();
	struct ibv_mw *two = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(two != NULL);
	CHECKF(bind_type_1(p.resp, two, target_mr, 31, (uintptr_t)target, 64) == EINVAL,
	       "ibv_bind_mw of a type 2 window");
	CHECK(ibv_dealloc_mw(two) == 0);
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	CHECK(mw != NULL);
	CHECK(bind_type_1(p.resp, mw, plain_mr, 32, (uintptr_t)plain, 64) == 0);
	expect_one(p.resp_cq, IBV_WC_MW_BIND_ERR, 32);
	destroy_pair(p);
	p = make_pair();
	CHECK(bind_type_1(p.resp, mw, target_mr, 33, (uintptr_t)target + REGION - 64, 128) == 0);
	expect_one(p.resp_cq, IBV_WC_MW_BIND_ERR, 33);
	CHECK(ibv_dealloc_mw(mw) == 0);
	destroy_pair(p);
	rule_ok("ibv_bind_mw(3): a type 2 window is EINVAL; a region without "
		"IBV_ACCESS_MW_BIND or a range beyond it is IBV_WC_MW_BIND_ERR");
}

static void rule_type_2_post_send(void)
{
	start_rule("4");
	struct pair p = make_pair();
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw != NULL);
	uint32_t rkey = post_bind_type_2(&p, mw, 41);
	memset(target + WIN, 0x4d, WIN_LEN);
	uint64_t base = (uintptr_t)(target + WIN);
	post_rdma(&p, IBV_WR_RDMA_READ, 42, 0, 128, base + WIN_LEN - 128, rkey);
	expect_one(p.req_cq, IBV_WC_SUCCESS, 42);
	CHECK(local[0] == 0x4d && local[127] == 0x4d);
	post_rdma(&p, IBV_WR_RDMA_READ, 43, 0, 128, base + WIN_LEN - 64, rkey);
	expect_one(p.req_cq, IBV_WC_REM_ACCESS_ERR, 43);
	CHECK(ibv_dealloc_mw(mw) == 0);
	destroy_pair(p);
	memset(target, 0, REGION);
	rule_ok("ibv_post_send(3) IBV_WR_BIND_MW type 2: READ inside succeeds, beyond it "
		"IBV_WC_REM_ACCESS_ERR");
}

static void rule_local_inv(void)
{
	start_rule("5");
	struct pair p = make_pair();
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw != NULL);
	uint32_t rkey = post_bind_type_2(&p, mw, 51);
	uint64_t base = (uintptr_t)(target + WIN);
	post_rdma(&p, IBV_WR_RDMA_WRITE, 52, 0, 8, base, rkey);
	expect_one(p.req_cq, IBV_WC_SUCCESS, 52);
	struct ibv_send_wr inv = { .wr_id = 53, .opcode = IBV_WR_LOCAL_INV,
				   .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	inv.invalidate_rkey = rkey;
	CHECK(ibv_post_send(p.resp, &inv, &bad) == 0);
	struct ibv_wc wc = expect_one(p.resp_cq, IBV_WC_SUCCESS, 53);
	CHECK(wc.opcode == IBV_WC_LOCAL_INV);
	post_rdma(&p, IBV_WR_RDMA_WRITE, 54, 0, 8, base, rkey);
	expect_one(p.req_cq, IBV_WC_REM_ACCESS_ERR, 54);
	CHECK(ibv_dealloc_mw(mw) == 0);
	destroy_pair(p);
	rule_ok("ibv_post_send(3) IBV_WR_LOCAL_INV: the window's R_Key is refused afterwards");
}

static void rule_send_with_inv(void)
{
	start_rule("6");
	struct pair p = make_pair();
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw != NULL);
	uint32_t rkey = ibv_inc_rkey(mw->rkey);
	struct ibv_mw_bind_info info = { .mr = target_mr, .addr = (uintptr_t)(target + WIN),
					 .length = WIN_LEN, .mw_access_flags = REMOTE_RW };
	ibv_wr_start(p.resp_ex);
	p.resp_ex->wr_id = 61;
	p.resp_ex->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(p.resp_ex, mw, rkey, &info);
	CHECK(ibv_wr_complete(p.resp_ex) == 0);
	CHECK(mw->rkey == rkey);
	expect_one(p.resp_cq, IBV_WC_SUCCESS, 61);
	uint64_t base = (uintptr_t)(target + WIN);
	post_rdma(&p, IBV_WR_RDMA_WRITE, 62, 0, 8, base, rkey);
	expect_one(p.req_cq, IBV_WC_SUCCESS, 62);

	struct ibv_sge rsge = { .addr = (uintptr_t)plain, .length = 64, .lkey = plain_mr->lkey };
	struct ibv_recv_wr recv = { .wr_id = 63, .sg_list = &rsge, .num_sge = 1 }, *rbad = NULL;
	CHECK(ibv_post_recv(p.resp, &recv, &rbad) == 0);
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = 16, .lkey = local_mr->lkey };
	struct ibv_send_wr send = { .wr_id = 64, .sg_list = &sge, .num_sge = 1,
				    .opcode = IBV_WR_SEND_WITH_INV,
				    .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	send.invalidate_rkey = rkey;
	CHECK(ibv_post_send(p.req, &send, &bad) == 0);
	expect_one(p.req_cq, IBV_WC_SUCCESS, 64);
	struct ibv_wc wc = expect_one(p.resp_cq, IBV_WC_SUCCESS, 63);
	CHECKF(wc.wc_flags & IBV_WC_WITH_INV, "wc_flags %#x without IBV_WC_WITH_INV",
	       wc.wc_flags);
	CHECKF(wc.invalidated_rkey == rkey, "invalidated_rkey %#x, expected %#x",
	       wc.invalidated_rkey, rkey);
	post_rdma(&p, IBV_WR_RDMA_WRITE, 65, 0, 8, base, rkey);
	expect_one(p.req_cq, IBV_WC_REM_ACCESS_ERR, 65);
	CHECK(ibv_dealloc_mw(mw) == 0);
	destroy_pair(p);
	rule_ok("ibv_wr_bind_mw type 2, then IBV_WR_SEND_WITH_INV: IBV_WC_WITH_INV and "
		"invalidated_rkey, the R_Key refused afterwards");
}

static void rule_busy(void)
{
	start_rule("7");
	struct pair p = make_pair();
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw != NULL);
	post_bind_type_2(&p, mw, 71);
	errno = 0;
	CHECKF(ibv_dereg_mr(target_mr) == EINVAL, "ibv_dereg_mr with a window bound");
	struct ibv_pd *other = ibv_alloc_pd(ctx);
	CHECK(other != NULL);
	struct ibv_mw *held = ibv_alloc_mw(other, IBV_MW_TYPE_1);
	CHECK(held != NULL);
	CHECKF(ibv_dealloc_pd(other) == EBUSY, "ibv_dealloc_pd with a window");
	CHECK(ibv_dealloc_mw(held) == 0);
	CHECK(ibv_dealloc_pd(other) == 0);
	CHECK(ibv_dealloc_mw(mw) == 0);
	destroy_pair(p);
	rule_ok("ibv_dereg_mr(3) with a window bound is EINVAL, ibv_dealloc_pd(3) with a "
		"window EBUSY");
}

int main(void)
{
	signal(SIGALRM, watchdog);
	setvbuf(stdout, NULL, _IOLBF, 0);
	start_rule("setup");
	ctx = open_softverbs0();
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	struct ibv_device_attr attr;
	CHECK(ibv_query_device(ctx, &attr) == 0);
	CHECKF(attr.max_mw > 0, "max_mw %d", attr.max_mw);
	pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	local_mr = region(&local, IBV_ACCESS_LOCAL_WRITE);
	target_mr = region(&target, MW_ACCESS);
	plain_mr = region(&plain, IBV_ACCESS_LOCAL_WRITE);
	rule_ok("a device with windows, three regions");

	rule_alloc();
	rule_type_1();
	rule_bind_errors();
	rule_type_2_post_send();
	rule_local_inv();
	rule_send_with_inv();
	rule_busy();

	start_rule("teardown");
	CHECK(ibv_dereg_mr(local_mr) == 0 && ibv_dereg_mr(target_mr) == 0 &&
	      ibv_dereg_mr(plain_mr) == 0);
	free(local);
	free(target);
	free(plain);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	rule_ok("everything freed");
	printf("ok %d checks\n", checks);
	return 0;
}
