/* `nabla ckpt`: list, show, verify (ok and damaged), export to safetensors
 * (single and sharded) and import back, checked through the library. */
#include "ckpt_test_util.h"

int main(void) {
  const char *bin = nb_test_nabla_bin();
  if (!bin) return nb_test_summary("ckpt/test_cli");
  nb_ctx *ctx = nb_ctx_create();
  char dir[4096], cmd[9000], out[16384];
  nb_test_scratch_dir(dir, sizeof dir, "ckpt", "cli");
  char ck[4200];
  snprintf(ck, sizeof ck, "%s/ck", dir);
  nb_ckpt_options o = {.directory = ck};
  nb_ckpt_manager *m = nb_ckpt_manager_create(ctx, &o);
  nb_tree *p = nb_tree_create(ctx);
  int64_t d[2] = {3, 5};
  nb_array *w = pattern_array(ctx, NB_BF16, 2, d, 9), *b = pattern_array(ctx, NB_I32, 1, d, 10);
  nb_tree_set_array(p, "layers/0/w", w);
  nb_tree_set_array(p, "layers/0/b", b);
  nb_ckpt_item it = {"params", p};
  nb_ckpt_save_opts so = {.has_metric = true, .metric = 0.25, .metadata_json = "{\"run\": \"x\"}"};
  CHECK_OK(ctx, nb_ckpt_save(m, 10, &it, 1, &so, NULL));
  CHECK_OK(ctx, nb_ckpt_save(m, 20, &it, 1, NULL, NULL));
  nb_ckpt_manager_destroy(m);

  snprintf(cmd, sizeof cmd, "%s ckpt list %s", bin, ck);
  CHECK(nb_test_run(cmd, out, sizeof out) == 0 && strstr(out, "10 ") && strstr(out, "0.25") && strstr(out, "20 "));
  snprintf(cmd, sizeof cmd, "%s ckpt show %s 10", bin, ck);
  CHECK(nb_test_run(cmd, out, sizeof out) == 0 && strstr(out, "params/layers/0/w") && strstr(out, "bf16[3,5]") &&
        strstr(out, "{\"run\":\"x\"}"));
  snprintf(cmd, sizeof cmd, "%s ckpt show %s/step_00000020", bin, ck);
  CHECK(nb_test_run(cmd, out, sizeof out) == 0 && strstr(out, "step 20") && strstr(out, "i32[3]"));
  snprintf(cmd, sizeof cmd, "%s ckpt verify %s", bin, ck);
  CHECK(nb_test_run(cmd, out, sizeof out) == 0 && strstr(out, "step 10: ok") && strstr(out, "step 20: ok"));

  /* export, show the file, import it elsewhere, compare */
  snprintf(cmd, sizeof cmd, "%s ckpt export %s latest %s/p.safetensors --item params --hf-names", bin, ck, dir);
  CHECK(nb_test_run(cmd, out, sizeof out) == 0);
  snprintf(cmd, sizeof cmd, "%s ckpt show %s/p.safetensors", bin, dir);
  CHECK(nb_test_run(cmd, out, sizeof out) == 0 && strstr(out, "layers.0.w") && strstr(out, "2 tensors"));
  /* the same file under another name is still shown as safetensors (told by its bytes) */
  char from[4200], to[4200];
  snprintf(from, sizeof from, "%s/p.safetensors", dir);
  snprintf(to, sizeof to, "%s/p.bin", dir);
  size_t len = 0;
  char *bytes = nb_test_read_file(from, &len);
  if (bytes) nb_test_write_file(to, bytes, len);
  free(bytes);
  snprintf(cmd, sizeof cmd, "%s ckpt show %s", bin, to);
  CHECK_MSG(nb_test_run(cmd, out, sizeof out) == 0 && strstr(out, "layers.0.w") && strstr(out, "2 tensors"), "%s", out);
  snprintf(cmd, sizeof cmd, "%s ckpt export %s 10 %s/sharded --shard-size 40", bin, ck, dir);
  CHECK(nb_test_run(cmd, out, sizeof out) == 0);
  snprintf(cmd, sizeof cmd, "%s ckpt import %s/sharded %s/ck2 --step 7 --item imported", bin, dir, dir);
  CHECK(nb_test_run(cmd, out, sizeof out) == 0);
  snprintf(cmd, sizeof cmd, "%s/ck2", dir);
  nb_ckpt_options o2 = {.directory = cmd, .read_only = true};
  m = nb_ckpt_manager_create(ctx, &o2);
  nb_tree *r = m ? nb_ckpt_restore(m, 7, NULL) : NULL;
  CHECK(r && nb_array_equal(nb_tree_get_array(r, "imported/params/layers/0/w"), w) &&
        nb_array_equal(nb_tree_get_array(r, "imported/params/layers/0/b"), b));
  nb_tree_destroy(r);
  nb_ckpt_manager_destroy(m);

  /* damage: verify fails and names the array */
  snprintf(cmd, sizeof cmd, "%s/step_00000020/params.00000.bin", ck);
  nb_test_flip_byte(cmd, 2);
  snprintf(cmd, sizeof cmd, "%s ckpt verify %s 2>&1", bin, ck);
  CHECK(nb_test_run(cmd, out, sizeof out) == 1 && strstr(out, "step 10: ok") && strstr(out, "'params/layers/0/w'"));
  snprintf(cmd, sizeof cmd, "%s ckpt show %s/nothing 2>&1", bin, dir);
  CHECK(nb_test_run(cmd, out, sizeof out) == 1 && strstr(out, "cannot be opened"));
  snprintf(cmd, sizeof cmd, "%s ckpt bogus 2>&1", bin);
  CHECK(nb_test_run(cmd, out, sizeof out) == 2 && strstr(out, "usage"));

  nb_array_release(w);
  nb_array_release(b);
  nb_tree_destroy(p);
  nb_test_rm_rf(dir);
  nb_ctx_destroy(ctx);
  return nb_test_summary("ckpt/test_cli");
}
