/*
 * ibv_rereg_mr(3) on the drop-in: it returns 0 or an enum ibv_rereg_mr_err_code with
 * errno set, keeps lkey and rkey, and updates mr->addr, mr->length and mr->pd.
 *
 *   1 IBV_REREG_MR_CHANGE_TRANSLATION: mr->addr and mr->length become the new range, the
 *     keys stay; a peer's RDMA WRITE lands in the new buffer, the old one is untouched
 *   2 IBV_REREG_MR_CHANGE_ACCESS and IBV_REREG_MR_CHANGE_PD: the keys stay, mr->pd is the
 *     new PD, and ibv_dealloc_pd of the old PD succeeds (the region left it)
 *   3 IBV_REREG_MR_ERR_INPUT with EINVAL: no flag, an unknown flag, a new translation
 *     with a NULL address or zero length, a memory window bound to the region
 *   4 IBV_REREG_MR_ERR_CMD: a new range that is not mapped (EFAULT), remote write without
 *     local write (EINVAL); the region stays as it was (mr->addr unchanged)
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

#include "rules.h"

static void rule_ok(const char *what)
{
	alarm(0);
	printf("rule %s: %s: ok\n", rule, what);
	fflush(stdout);
}

#define REGION 8192
#define RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;

static char *buffer(void)
{
	char *b = aligned_alloc(4096, REGION);
	CHECK(b != NULL);
	memset(b, 0, REGION);
	return b;
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
	char *local = buffer(), *old = buffer(), *fresh = buffer();
	struct ibv_mr *local_mr = ibv_reg_mr(pd, local, REGION, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *mr = ibv_reg_mr(pd, old, REGION, RW);
	CHECK(local_mr != NULL && mr != NULL);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(cq != NULL);
	struct ibv_qp_init_attr attr = { .send_cq = cq, .recv_cq = cq,
					 .cap = { .max_send_wr = 4, .max_recv_wr = 4,
						  .max_send_sge = 1, .max_recv_sge = 1 },
					 .qp_type = IBV_QPT_RC, .sq_sig_all = 1 };
	struct ibv_qp *a = ibv_create_qp(pd, &attr), *b = ibv_create_qp(pd, &attr);
	CHECK(a != NULL && b != NULL);
	connect_rc(a, b->qp_num, &gid, IBV_ACCESS_REMOTE_WRITE);
	connect_rc(b, a->qp_num, &gid, IBV_ACCESS_REMOTE_WRITE);
	uint32_t lkey = mr->lkey, rkey = mr->rkey;
	rule_ok("a region and a connected RC pair");

	start_rule("1");
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, fresh, 4096, 0) == 0);
	CHECK(mr->addr == fresh && mr->length == 4096);
	CHECK(mr->lkey == lkey && mr->rkey == rkey);
	memset(local, 0x6b, 64);
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = 64, .lkey = local_mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE }, *bad = NULL;
	wr.wr.rdma.remote_addr = (uintptr_t)fresh + 128;
	wr.wr.rdma.rkey = mr->rkey;
	CHECK(ibv_post_send(a, &wr, &bad) == 0);
	struct ibv_wc wc;
	CHECK(poll_until(cq, 1, &wc, WAIT_MS) == 1);
	CHECKF(wc.status == IBV_WC_SUCCESS, "status %s", ibv_wc_status_str(wc.status));
	CHECK(fresh[128] == 0x6b && fresh[191] == 0x6b && old[128] == 0);
	rule_ok("IBV_REREG_MR_CHANGE_TRANSLATION: the keys reach the new range only");

	start_rule("2");
	struct ibv_pd *other = ibv_alloc_pd(ctx);
	CHECK(other != NULL);
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS, other, NULL,
			   0, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND) == 0);
	CHECK(mr->pd == other && mr->lkey == lkey && mr->rkey == rkey && mr->addr == fresh);
	CHECKF(ibv_dealloc_pd(other) == EBUSY, "ibv_dealloc_pd of the region's new PD");
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, 0) == 0);
	CHECK(ibv_dealloc_pd(other) == 0);
	rule_ok("IBV_REREG_MR_CHANGE_PD and _ACCESS: keys kept, the region moves PD");

	start_rule("3");
	errno = 0;
	CHECK(ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT && errno == EINVAL);
	errno = 0;
	CHECK(ibv_rereg_mr(mr, 1 << 5, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT &&
	      errno == EINVAL);
	errno = 0;
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, 64, 0) ==
		      IBV_REREG_MR_ERR_INPUT &&
	      errno == EINVAL);
	errno = 0;
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, old, 0, 0) ==
		      IBV_REREG_MR_ERR_INPUT &&
	      errno == EINVAL);
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	CHECK(mw != NULL);
	struct ibv_mw_bind bind = { .wr_id = 2, .send_flags = IBV_SEND_SIGNALED,
				    .bind_info = { .mr = mr, .addr = (uintptr_t)fresh,
						   .length = 64,
						   .mw_access_flags = IBV_ACCESS_REMOTE_READ } };
	CHECK(ibv_bind_mw(b, mw, &bind) == 0);
	CHECK(poll_until(cq, 1, &wc, WAIT_MS) == 1 && wc.status == IBV_WC_SUCCESS);
	errno = 0;
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, RW) ==
		      IBV_REREG_MR_ERR_INPUT &&
	      errno == EINVAL);
	CHECK(ibv_dealloc_mw(mw) == 0);
	rule_ok("IBV_REREG_MR_ERR_INPUT (EINVAL): no flag, unknown flag, empty translation, "
		"a window bound");

	start_rule("4");
	/* Far from other mappings: a thread's stack or arena mapped meanwhile would fill an
	 * ordinary hole (seen under AddressSanitizer). */
	void *hole = map_far_pages(1, PROT_NONE);
	CHECK(munmap(hole, 4096) == 0);
	errno = 0;
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, hole, 4096, 0) ==
		      IBV_REREG_MR_ERR_CMD &&
	      errno == EFAULT);
	errno = 0;
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			   IBV_ACCESS_REMOTE_WRITE) == IBV_REREG_MR_ERR_CMD &&
	      errno == EINVAL);
	CHECK(mr->addr == fresh && mr->length == 4096);
	rule_ok("IBV_REREG_MR_ERR_CMD: unmapped range EFAULT, remote write without local "
		"write EINVAL; the region unchanged");

	start_rule("teardown");
	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dereg_mr(mr) == 0 && ibv_dereg_mr(local_mr) == 0);
	free(local);
	free(old);
	free(fresh);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	rule_ok("everything freed");
	printf("ok %d checks\n", checks);
	return 0;
}
