/*
 * ibv_alloc_parent_domain(3), ibv_alloc_td(3) and ibv_create_cq_ex(3)'s parent_domain on
 * the drop-in:
 *
 *   1 ibv_alloc_td: a comp_mask bit is EINVAL. ibv_alloc_parent_domain: a NULL pd, an
 *     unknown comp_mask bit, IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS without free, and a
 *     parent domain as the pd are EINVAL
 *   2 a parent domain is usable wherever a PD is: ibv_reg_mr and ibv_create_qp on it act
 *     on its PD (an RDMA WRITE between two QPs in it lands); ibv_dealloc_pd of the PD is
 *     EBUSY while the parent domain exists, of the parent domain EBUSY while a QP made in
 *     it exists
 *   3 a CQ created in a parent domain (IBV_CQ_INIT_ATTR_MASK_PD) takes its ring from alloc
 *     (called with the parent domain, pd_context, 64 bytes a slot, alignment 64, our
 *     SOFTVERBS_RES_TYPE_CQ_RING), the completion is in the application's buffer before
 *     and while it is polled, ibv_resize_cq takes the new ring from alloc, and
 *     ibv_destroy_cq gives both back through free with the same pd_context
 *   4 alloc answering IBV_ALLOCATOR_USE_DEFAULT: the CQ works and free is never called;
 *     alloc answering NULL: ibv_create_cq_ex fails with ENOMEM; an ordinary PD as
 *     parent_domain is EINVAL
 *   5 a thread domain: a CQ in a parent domain with a td polls (no consumer lock);
 *     ibv_dealloc_td is EBUSY while a parent domain uses it, 0 after
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

/* Our resource types (crates/softverbs-capi/src/pd.rs): ("SV" << 32) | n. */
#define SOFTVERBS_RES_TYPE_CQ_RING ((0x5356ULL << 32) | 1)

static void rule_ok(const char *what)
{
	alarm(0);
	printf("rule %s: %s: ok\n", rule, what);
	fflush(stdout);
}

/* The counting allocator: what it was asked, what it handed out, what came back. */
enum answer { GIVE, USE_DEFAULT, REFUSE };
struct counting {
	enum answer answer;
	int allocs, frees;
	struct ibv_pd *last_pd;
	size_t last_size, last_alignment;
	uint64_t last_type;
	void *blocks[8];
	size_t sizes[8];
	int live;
	int bad_context;
};

static void *count_alloc(struct ibv_pd *pd, void *pd_context, size_t size, size_t alignment,
			 uint64_t resource_type)
{
	struct counting *c = pd_context;
	c->allocs++;
	c->last_pd = pd;
	c->last_size = size;
	c->last_alignment = alignment;
	c->last_type = resource_type;
	if (c->answer == USE_DEFAULT)
		return IBV_ALLOCATOR_USE_DEFAULT;
	if (c->answer == REFUSE || c->live == 8)
		return NULL;
	void *p = aligned_alloc(alignment, (size + alignment - 1) / alignment * alignment);
	if (p) {
		memset(p, 0xee, size);
		c->blocks[c->live] = p;
		c->sizes[c->live++] = size;
	}
	return p;
}

static void count_free(struct ibv_pd *pd, void *pd_context, void *ptr, uint64_t resource_type)
{
	(void)pd;
	(void)resource_type;
	struct counting *c = pd_context;
	c->frees++;
	for (int i = 0; i < c->live; i++) {
		if (c->blocks[i] == ptr) {
			free(ptr);
			c->blocks[i] = c->blocks[--c->live];
			c->sizes[i] = c->sizes[c->live];
			return;
		}
	}
	c->bad_context++; /* a pointer we never gave */
}

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;

static struct ibv_pd *parent(struct ibv_td *td, struct counting *c)
{
	struct ibv_parent_domain_init_attr attr = {
		.pd = pd, .td = td,
		.comp_mask = c ? IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
					 IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT
			       : 0,
		.alloc = c ? count_alloc : NULL, .free = c ? count_free : NULL, .pd_context = c };
	return ibv_alloc_parent_domain(ctx, &attr);
}

static struct ibv_cq_ex *cq_in(struct ibv_pd *domain, int cqe)
{
	struct ibv_cq_init_attr_ex attr = { .cqe = cqe, .wc_flags = IBV_WC_STANDARD_FLAGS,
					    .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD,
					    .parent_domain = domain };
	return ibv_create_cq_ex(ctx, &attr);
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
	rule_ok("a context and a PD");

	start_rule("1");
	struct ibv_td_init_attr td_attr = { .comp_mask = 1 };
	errno = 0;
	CHECK(ibv_alloc_td(ctx, &td_attr) == NULL && errno == EINVAL);
	struct ibv_parent_domain_init_attr bad = { .pd = NULL };
	errno = 0;
	CHECK(ibv_alloc_parent_domain(ctx, &bad) == NULL && errno == EINVAL);
	bad = (struct ibv_parent_domain_init_attr){ .pd = pd, .comp_mask = 1 << 7 };
	errno = 0;
	CHECK(ibv_alloc_parent_domain(ctx, &bad) == NULL && errno == EINVAL);
	bad = (struct ibv_parent_domain_init_attr){
		.pd = pd, .comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS, .alloc = count_alloc };
	errno = 0;
	CHECK(ibv_alloc_parent_domain(ctx, &bad) == NULL && errno == EINVAL);
	struct ibv_pd *plain = parent(NULL, NULL);
	CHECK(plain != NULL && plain->context == ctx && plain->handle == pd->handle);
	bad = (struct ibv_parent_domain_init_attr){ .pd = plain };
	errno = 0;
	CHECK(ibv_alloc_parent_domain(ctx, &bad) == NULL && errno == EINVAL);
	rule_ok("EINVAL: td comp_mask, NULL pd, unknown comp_mask, alloc without free, a "
		"parent domain as pd");

	start_rule("2");
	char *buf = aligned_alloc(4096, 8192);
	CHECK(buf != NULL);
	memset(buf, 0, 8192);
	struct ibv_mr *mr = ibv_reg_mr(plain, buf, 8192,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr != NULL && mr->pd == plain);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(cq != NULL);
	struct ibv_qp_init_attr qattr = { .send_cq = cq, .recv_cq = cq,
					  .cap = { .max_send_wr = 4, .max_recv_wr = 4,
						   .max_send_sge = 1, .max_recv_sge = 1 },
					  .qp_type = IBV_QPT_RC, .sq_sig_all = 1 };
	struct ibv_qp *a = ibv_create_qp(plain, &qattr), *b = ibv_create_qp(plain, &qattr);
	CHECK(a != NULL && b != NULL && a->pd == plain);
	connect_rc(a, b->qp_num, &gid, IBV_ACCESS_REMOTE_WRITE);
	connect_rc(b, a->qp_num, &gid, IBV_ACCESS_REMOTE_WRITE);
	memset(buf, 0x5a, 64);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 11, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE }, *bad_wr = NULL;
	wr.wr.rdma.remote_addr = (uintptr_t)buf + 4096;
	wr.wr.rdma.rkey = mr->rkey;
	CHECK(ibv_post_send(a, &wr, &bad_wr) == 0);
	struct ibv_wc wc;
	CHECK(poll_until(cq, 1, &wc, WAIT_MS) == 1);
	CHECKF(wc.status == IBV_WC_SUCCESS, "status %s", ibv_wc_status_str(wc.status));
	CHECK(buf[4096] == 0x5a && buf[4096 + 63] == 0x5a);
	CHECKF(ibv_dealloc_pd(pd) == EBUSY, "dealloc of the PD under a parent domain");
	CHECKF(ibv_dealloc_pd(plain) == EBUSY, "dealloc of a parent domain with QPs");
	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
	CHECKF(ibv_dealloc_pd(plain) == EBUSY, "dealloc of a parent domain with an MR");
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_dealloc_pd(plain) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	free(buf);
	rule_ok("reg_mr and create_qp on a parent domain act on its PD; EBUSY both ways");

	start_rule("3");
	struct counting counter = { .answer = GIVE };
	struct ibv_pd *dom = parent(NULL, &counter);
	CHECK(dom != NULL);
	CHECK(counter.allocs == 0);
	struct ibv_cq_ex *cqx = cq_in(dom, 8);
	CHECK(cqx != NULL);
	CHECKF(counter.allocs == 1, "alloc called %d times", counter.allocs);
	CHECK(counter.last_pd == dom && counter.last_type == SOFTVERBS_RES_TYPE_CQ_RING);
	CHECK(counter.last_alignment == 64 && counter.last_size == 64 * (size_t)cqx->cqe);
	unsigned char *ring = counter.blocks[0];
	char *mem = aligned_alloc(4096, 8192);
	CHECK(mem != NULL);
	memset(mem, 0x33, 8192);
	mr = ibv_reg_mr(dom, mem, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr != NULL);
	qattr.send_cq = qattr.recv_cq = ibv_cq_ex_to_cq(cqx);
	a = ibv_create_qp(dom, &qattr);
	b = ibv_create_qp(dom, &qattr);
	CHECK(a != NULL && b != NULL);
	connect_rc(a, b->qp_num, &gid, IBV_ACCESS_REMOTE_WRITE);
	connect_rc(b, a->qp_num, &gid, IBV_ACCESS_REMOTE_WRITE);
	sge = (struct ibv_sge){ .addr = (uintptr_t)mem, .length = 32, .lkey = mr->lkey };
	wr.wr_id = 0x1122334455667788ULL;
	wr.wr.rdma.remote_addr = (uintptr_t)mem + 4096;
	wr.wr.rdma.rkey = mr->rkey;
	CHECK(ibv_post_send(a, &wr, &bad_wr) == 0);
	/* The completion appears in the application's buffer: slot 0's sequence word becomes
	 * 1 and bytes 8..56 are the struct ibv_wc. A bounded wait on the ring itself, before
	 * any poll (the device's progress thread completes the write). */
	uint64_t seq = 0;
	for (int i = 0; i < MAX_ITERS && seq != 1; i++) {
		seq = __atomic_load_n((uint64_t *)ring, __ATOMIC_ACQUIRE);
		if (seq != 1)
			usleep(50);
	}
	CHECKF(seq == 1, "slot 0's sequence word is %" PRIu64, seq);
	struct ibv_wc in_ring;
	memcpy(&in_ring, ring + 8, sizeof(in_ring));
	CHECK(in_ring.wr_id == 0x1122334455667788ULL && in_ring.status == IBV_WC_SUCCESS &&
	      in_ring.opcode == IBV_WC_RDMA_WRITE && in_ring.qp_num == a->qp_num);
	CHECK(poll_until(ibv_cq_ex_to_cq(cqx), 1, &wc, WAIT_MS) == 1);
	/* Field by field: the struct's padding is not part of the completion. */
	CHECK(wc.wr_id == in_ring.wr_id && wc.status == in_ring.status &&
	      wc.opcode == in_ring.opcode && wc.qp_num == in_ring.qp_num &&
	      wc.byte_len == in_ring.byte_len && wc.wc_flags == in_ring.wc_flags);
	CHECK((unsigned char)mem[4096] == 0x33);
	CHECK(ibv_resize_cq(ibv_cq_ex_to_cq(cqx), 32) == 0);
	CHECKF(counter.allocs == 2 && counter.last_size == 64 * 32, "resize: %d allocs",
	       counter.allocs);
	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0 && ibv_dereg_mr(mr) == 0);
	CHECKF(ibv_dealloc_pd(dom) == EBUSY, "dealloc of a parent domain with a CQ");
	CHECK(counter.frees == 0);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)) == 0);
	CHECKF(counter.frees == 2 && counter.live == 0 && counter.bad_context == 0,
	       "free: %d calls, %d live, %d foreign", counter.frees, counter.live,
	       counter.bad_context);
	CHECK(ibv_dealloc_pd(dom) == 0);
	free(mem);
	rule_ok("the CQ ring lives in the application's buffer: alloc, inspect, resize, free");

	start_rule("4");
	struct counting dflt = { .answer = USE_DEFAULT };
	dom = parent(NULL, &dflt);
	CHECK(dom != NULL);
	cqx = cq_in(dom, 4);
	CHECK(cqx != NULL && dflt.allocs == 1);
	CHECK(ibv_poll_cq(ibv_cq_ex_to_cq(cqx), 1, &wc) == 0);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)) == 0);
	CHECK(dflt.frees == 0);
	CHECK(ibv_dealloc_pd(dom) == 0);
	struct counting refuse = { .answer = REFUSE };
	dom = parent(NULL, &refuse);
	CHECK(dom != NULL);
	errno = 0;
	CHECK(cq_in(dom, 4) == NULL && errno == ENOMEM);
	CHECK(refuse.allocs == 1 && refuse.frees == 0);
	CHECK(ibv_dealloc_pd(dom) == 0);
	errno = 0;
	CHECK(cq_in(pd, 4) == NULL && errno == EINVAL);
	rule_ok("IBV_ALLOCATOR_USE_DEFAULT (no free), NULL (ENOMEM), a PD not a parent "
		"domain (EINVAL)");

	start_rule("5");
	td_attr.comp_mask = 0;
	struct ibv_td *td = ibv_alloc_td(ctx, &td_attr);
	CHECK(td != NULL && td->context == ctx);
	struct counting tdc = { .answer = GIVE };
	dom = parent(td, &tdc);
	CHECK(dom != NULL);
	CHECKF(ibv_dealloc_td(td) == EBUSY, "dealloc_td while a parent domain uses it");
	cqx = cq_in(dom, 4);
	CHECK(cqx != NULL && tdc.allocs == 1);
	CHECK(ibv_poll_cq(ibv_cq_ex_to_cq(cqx), 4, &wc) == 0);
	struct ibv_poll_cq_attr pattr = { 0 };
	CHECK(ibv_start_poll(cqx, &pattr) == ENOENT);
	CHECK(ibv_resize_cq(ibv_cq_ex_to_cq(cqx), 16) == 0 && tdc.allocs == 2);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)) == 0 && tdc.frees == 2);
	CHECK(ibv_dealloc_pd(dom) == 0);
	CHECK(ibv_dealloc_td(td) == 0);
	rule_ok("a thread domain: its CQ polls lock-free; dealloc_td EBUSY, then 0");

	start_rule("teardown");
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	rule_ok("everything released");
	printf("ok %d checks\n", checks);
	return 0;
}
