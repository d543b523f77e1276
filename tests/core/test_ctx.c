/* The context's error message: wrapping the current message with more
 * context (the way every library wraps a cause) keeps both parts whole. */
#include "test.h"

static void test_wrap_error(void) {
  nb_ctx *ctx = nb_ctx_create();
  nb_errorf(ctx, NB_ERR_IO, "data.bin: cannot open: No such file or directory");
  CHECK(nb_errorf(ctx, nb_ctx_status(ctx), "train: data.train '%s': %s", "x.txt", nb_ctx_error(ctx)) == NB_ERR_IO);
  CHECK_MSG(!strcmp(nb_ctx_error(ctx), "train: data.train 'x.txt': data.bin: cannot open: No such file or directory"),
            "'%s'", nb_ctx_error(ctx));
  /* twice more, and a message longer than the buffer: cut at the end, never garbled */
  nb_errorf(ctx, NB_ERR_IO, "resume: %s", nb_ctx_error(ctx));
  nb_errorf(ctx, NB_ERR_IO, "run: %s", nb_ctx_error(ctx));
  CHECK_MSG(!strcmp(nb_ctx_error(ctx), "run: resume: train: data.train 'x.txt': data.bin: cannot open: No such file or directory"), "'%s'",
            nb_ctx_error(ctx));
  char big[5000];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = 0;
  nb_errorf(ctx, NB_ERR_FORMAT, "%s", big);
  nb_errorf(ctx, NB_ERR_FORMAT, "outer: %s", nb_ctx_error(ctx));
  size_t n = strlen(nb_ctx_error(ctx));
  CHECK_MSG(n > 1000 && n < sizeof big && !strncmp(nb_ctx_error(ctx), "outer: aaaa", 11) &&
                strspn(nb_ctx_error(ctx) + 7, "a") == n - 7,
            "%zu bytes: %.40s", n, nb_ctx_error(ctx));
  nb_ctx_destroy(ctx);
}

/* nb_graph_fail_at: a library's own check poisons the graph; the first error
 * is the one kept and reported, with the caller's location. */
static void test_graph_fail(void) {
  nb_ctx *ctx = nb_ctx_create();
  nb_graph *g = nb_graph_create(ctx);
  nb_val *x = nb_scalar(g, NB_F32, 1);
  nb_val *p = nb_graph_fail_at((nb_loc){"lib.c", 7}, g, NB_ERR_SHAPE, "lib: want %d numbers", 3);
  CHECK(p != NULL && p != x && nb_graph_status(g) == NB_ERR_SHAPE);
  CHECK_MSG(!strcmp(nb_graph_error(g), "lib: want 3 numbers (at lib.c:7)"), "'%s'", nb_graph_error(g));
  CHECK(nb_add(x, p) == p); /* later ops on the poison stay poisoned */
  nb_graph_fail_at(NB_HERE, g, NB_ERR_IO, "second");
  CHECK(nb_graph_status(g) == NB_ERR_SHAPE && strstr(nb_ctx_error(ctx), "lib: want 3 numbers"));
  CHECK(nb_graph_fail_at(NB_HERE, NULL, NB_ERR_IO, "no graph") == NULL);
  nb_graph_destroy(g);
  nb_ctx_destroy(ctx);
}

int main(void) {
  test_wrap_error();
  test_graph_fail();
  return nb_test_summary("core/ctx");
}
