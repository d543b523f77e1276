/* One checkpoint written by 2 processes (nb_ckpt_save_sharded, as
 * tests/dist/mpirun.sh 2): rank 0 writes rows 0-2 of a 5-row array and a
 * scalar, rank 1 rows 3-4; both read back the whole arrays bit for bit, and
 * the manifest lists the array's two shards. A save where rank 1 fails
 * (a block that is not its rows; an I/O error while it writes its data file)
 * fails on both ranks, names rank 1 on rank 0, commits nothing and leaves
 * no temporary directory: the previous step stays the latest. */
#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include "ckpt/internal.h"
#include "nabla/dist.h"
#include "test.h"
#include "testfs.h"

static int rank;

/* element (i, j) of the whole 5x3 array at a step */
static float value(int64_t step, int64_t i, int64_t j) { return (float)(step * 100 + i * 3 + j) + 0.25f; }

/* rows [lo, lo + n) of the whole array of a step */
static nb_array *rows(nb_ctx *ctx, int64_t step, int64_t lo, int64_t n) {
  int64_t d[2] = {n, 3};
  nb_array *a = nb_array_empty(ctx, NB_F32, 2, d);
  float *p = nb_array_data_mut(a);
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < 3; j++) p[i * 3 + j] = value(step, lo + i, j);
  return a;
}

/* This rank's items of a step saved: rank 0 rows 0-2 and the scalar, rank 1
 * rows 3-4 (`bad`: 4 rows, not its block). */
static nb_status save(nb_ctx *ctx, nb_ckpt_manager *m, nb_comm *world, int64_t step, bool bad) {
  nb_tree *t = nb_tree_create(ctx), *whole = nb_tree_create(ctx);
  nb_array *w = rank == 0 ? rows(ctx, step, 0, 3) : rows(ctx, step, 3, bad ? 4 : 2);
  nb_tree_set_array(t, "w", w);
  if (rank == 0) {
    nb_array *s = nb_array_scalar(ctx, NB_F32, (double)step);
    nb_tree_set_array(t, "s", s);
    nb_array_release(s);
  }
  int64_t d[2] = {5, 3};
  nb_tree_set(whole, "params/w", nb_leaf_aval(nb_aval_make(NB_F32, 2, d)));
  nb_tree_set(whole, "params/s", nb_leaf_aval(nb_aval_make(NB_F32, 0, NULL)));
  nb_ckpt_item items[1] = {{"params", t}};
  nb_ckpt_shards sh = {.comm = world, .whole = whole, .index = rank, .count = 2};
  nb_status s = nb_ckpt_save_sharded(m, step, items, 1, NULL, &sh);
  nb_array_release(w);
  nb_tree_destroy(t);
  nb_tree_destroy(whole);
  return s;
}

static void check_restores(nb_ctx *ctx, nb_ckpt_manager *m, int64_t step) {
  nb_tree *r = nb_ckpt_restore(m, step, NULL);
  nb_array *want = rows(ctx, step, 0, 5), *w = r ? nb_tree_get_array(r, "params/w") : NULL;
  CHECK_MSG(w && nb_array_equal(w, want), "rank %d: step %lld's whole array: %s", rank, (long long)step, nb_ctx_error(ctx));
  nb_array *s = r ? nb_tree_get_array(r, "params/s") : NULL;
  CHECK_MSG(s && nb_array_get(s, 0) == (double)step, "rank %d: step %lld's scalar", rank, (long long)step);
  nb_ckpt_info *info = nb_ckpt_info_load(m, step);
  for (size_t i = 0; info && i < nb_ckpt_info_count(info); i++) {
    const nb_ckpt_entry *e = nb_ckpt_info_entry(info, i);
    CHECK_MSG(e->n_shards == (!strcmp(e->path, "w") ? 2 : 1), "'%s' has %d shards", e->path, e->n_shards);
  }
  CHECK(info && nb_ckpt_info_count(info) == 2);
  nb_ckpt_info_destroy(info);
  nb_array_release(want);
  nb_tree_destroy(r);
}

/* No step but `latest` committed after it, and no temporary directory left. */
static void check_only_up_to(nb_ctx *ctx, nb_ckpt_manager *m, const char *dir, int64_t latest) {
  int64_t got = -2;
  CHECK_OK(ctx, nb_ckpt_latest_step(m, &got));
  CHECK_MSG(got == latest, "rank %d: latest step %lld, want %lld", rank, (long long)got, (long long)latest);
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d)))
    CHECK_MSG(strncmp(e->d_name, ".tmp-", 5) != 0, "rank %d: '%s' left behind", rank, e->d_name);
  if (d) closedir(d);
}

int main(int argc, char **argv) {
  nb_ctx *ctx = nb_ctx_create();
  if (nb_dist_init(ctx, &argc, &argv)) {
    fprintf(stderr, "%s\n", nb_ctx_error(ctx));
    return 1;
  }
  rank = nb_dist_rank();
  nb_comm *world = nb_dist_world(ctx);
  if (!world || nb_dist_size() != 2) {
    fprintf(stderr, "needs 2 processes (tests/dist/mpirun.sh 2 ...): %s\n", nb_ctx_error(ctx));
    return 1;
  }
  /* rank 0's scratch directory for both */
  char dir[512] = {0};
  if (rank == 0) nb_test_scratch_dir(dir, sizeof dir, "dist", "ckpt-sharded");
  CHECK_OK(ctx, world->ops->sendrecv(world, ctx, dir, rank == 0 ? 1 : -1, dir, rank == 1 ? 0 : -1, sizeof dir));
  size_t base = nb_ctx_bytes_in_use(ctx);
  /* rank 0 owns the directory; rank 1 opens it read-only once it exists */
  nb_ckpt_manager *m = rank == 0 ? nb_ckpt_manager_create(ctx, &(nb_ckpt_options){.directory = dir}) : NULL;
  CHECK_OK(ctx, world->ops->barrier(world, ctx));
  if (rank == 1) m = nb_ckpt_manager_create(ctx, &(nb_ckpt_options){.directory = dir, .read_only = true});
  CHECK_MSG(m, "rank %d: %s", rank, nb_ctx_error(ctx));

  CHECK_OK(ctx, save(ctx, m, world, 1, false));
  check_restores(ctx, m, 1);

  /* rank 1 passes 4 rows where its block has 2 */
  nb_status s = save(ctx, m, world, 2, rank == 1);
  CHECK_MSG(s != NB_OK, "rank %d: a save with a bad block succeeded", rank);
  if (rank == 1) CHECK_ERR(ctx, NB_ERR_SHAPE, "not block 1 of 2");
  else CHECK_ERR(ctx, NB_ERR_SHAPE, "process 1 of 2 failed");
  CHECK_OK(ctx, world->ops->barrier(world, ctx));
  check_only_up_to(ctx, m, dir, 1);

  /* rank 1's second I/O operation (writing its data file) fails */
  if (rank == 1) nb_ckpt__io_fault(2, false);
  s = save(ctx, m, world, 3, false);
  nb_ckpt__io_fault(0, false);
  CHECK_MSG(s == NB_ERR_IO, "rank %d: a save with an I/O error gave %s", rank, nb_status_name(s));
  nb_ctx_clear_error(ctx);
  CHECK_OK(ctx, world->ops->barrier(world, ctx));
  check_only_up_to(ctx, m, dir, 1);
  check_restores(ctx, m, 1);

  /* and the next save goes through */
  CHECK_OK(ctx, save(ctx, m, world, 4, false));
  check_restores(ctx, m, 4);

  nb_ckpt_manager_destroy(m);
  CHECK_MSG(nb_ctx_bytes_in_use(ctx) == base, "%zu bytes leaked on rank %d", nb_ctx_bytes_in_use(ctx) - base, rank);
  CHECK_OK(ctx, world->ops->barrier(world, ctx));
  if (rank == 0) nb_test_rm_rf(dir);
  char name[64];
  snprintf(name, sizeof name, "dist/ckpt_sharded rank %d", rank);
  int rc = nb_test_summary(name);
  nb_dist_comm_destroy(world);
  nb_ctx_destroy(ctx);
  nb_dist_finalize();
  return rc;
}
