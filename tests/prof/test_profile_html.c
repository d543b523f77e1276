/* The profile page renders in a browser: nb_prof_stop draws profile.html
 * for a traced jitted program (a GEMM and a fused kernel), headless
 * Chromium takes a screenshot of it, and the screenshot is not blank: it
 * has many colours, a share of non-white pixels, and the roofline's red
 * GEMM and blue kernel points. The PNG is read back by Chromium itself (a
 * second page draws it, as a data: URL, into a canvas and counts), so the
 * test needs no image library. Without Chromium (chromium-headless-shell,
 * chromium, or $NABLA_CHROMIUM) it reports itself skipped (exit 77). */
#include <sys/stat.h>
#include <unistd.h>

#include "jitcheck.h"
#include "testfs.h"

static const char *find_chromium(char *buf, size_t cap) {
  const char *env = getenv("NABLA_CHROMIUM");
  if (env && *env) return access(env, X_OK) == 0 ? env : NULL;
  static const char *const names[] = {"chromium-headless-shell", "chromium", "google-chrome", "chromium-browser"};
  const char *path = getenv("PATH");
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    for (const char *p = path ? path : "/usr/bin"; *p;) {
      size_t n = strcspn(p, ":");
      snprintf(buf, cap, "%.*s/%s", (int)n, p, names[i]);
      if (access(buf, X_OK) == 0) return buf;
      p += n + (p[n] == ':');
    }
  return NULL;
}

static void write_profile(nb_ctx *ctx, const char *trace) {
  nb_graph *g = nb_graph_create(ctx);
  nb_val *x = nb_graph_input(g, "x", nb_aval_make(NB_F32, 2, (int64_t[]){64, 64}));
  nb_val *w = nb_graph_input(g, "params/w", nb_aval_make(NB_F32, 2, (int64_t[]){64, 64}));
  nb_dot_dims dn = {.n_contract = 1, .lhs_contract = {1}, .rhs_contract = {0}};
  static const int axis[1] = {1};
  nb_graph_output(g, "z", nb_reduce_sum(nb_tanh(nb_dot_general(x, w, &dn, NB_F32)), 1, axis));
  nb_jit_opts o = nb_test_jit_opts(NULL);
  o.threads = 1;
  nb_exe *e = nb_jit(ctx, g, &o);
  CHECK_OK(ctx, e ? NB_OK : nb_ctx_status(ctx));
  nb_test_rng rng = {3};
  nb_tree *in = nb_tree_create(ctx);
  nb_test_set_randn(in, &rng, "x", NB_F32, 2, (int64_t[]){64, 64});
  nb_test_set_randn(in, &rng, "params/w", NB_F32, 2, (int64_t[]){64, 64});
  /* roofs that put both points well inside the plot */
  CHECK_OK(ctx, nb_prof_start(ctx, &(nb_prof_trace_opts){.path = trace, .peak_flops = 100e9, .peak_bytes_per_s = 10e9}));
  for (int r = 0; e && r < 5; r++) {
    nb_tree *out = nb_tree_create(ctx);
    CHECK_OK(ctx, nb_exe_run(e, in, out));
    nb_tree_destroy(out);
  }
  CHECK_OK(ctx, nb_prof_stop(ctx));
  nb_tree_destroy(in);
  nb_exe_destroy(e);
  nb_graph_destroy(g);
}

static char *base64(const unsigned char *p, size_t n) {
  static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char *out = malloc(4 * (n / 3 + 1) + 1), *o = out;
  for (size_t i = 0; out && i < n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
    *o++ = tab[v >> 18 & 63], *o++ = tab[v >> 12 & 63];
    *o++ = i + 1 < n ? tab[v >> 6 & 63] : '=', *o++ = i + 2 < n ? tab[v & 63] : '=';
  }
  if (o) *o = 0;
  return out;
}

/* counts over the screenshot, done by Chromium: distinct colours, non-white
 * pixels, the GEMM points' red and the kernels' blue */
static const char checker[] =
    "<script>window.onload=function(){var i=document.getElementById('s'),c=document.createElement('canvas');"
    "c.width=i.naturalWidth;c.height=i.naturalHeight;var x=c.getContext('2d');x.drawImage(i,0,0);"
    "var d=x.getImageData(0,0,c.width,c.height).data,seen={},n=0,nw=0,red=0,blue=0;"
    "for(var p=0;p<d.length;p+=4){var r=d[p],g=d[p+1],b=d[p+2],k=(r<<16)|(g<<8)|b;if(!seen[k]){seen[k]=1;n++}"
    "if(r<245||g<245||b<245)nw++;if(r>180&&g<150&&b<150)red++;if(b>150&&r<140&&g<190)blue++}"
    "document.body.textContent='RESULT '+c.width+' '+c.height+' '+n+' '+nw+' '+red+' '+blue;}</script>";

int main(void) {
  char bin[2048];
  const char *chromium = find_chromium(bin, sizeof bin);
  if (!chromium) {
    printf("prof/test_profile_html: skipped: no headless Chromium (apt-get install chromium-headless-shell, or set NABLA_CHROMIUM)\n");
    return 77;
  }
  nb_ctx *ctx = nb_ctx_create();
  char dir[1024], trace[1100], page[1100], shot[1100], check[1100], cmd[16384];
  nb_test_scratch_dir(dir, sizeof dir, "prof", "profile_html");
  snprintf(trace, sizeof trace, "%s/trace.json", dir);
  snprintf(page, sizeof page, "%s/profile.html", dir);
  snprintf(shot, sizeof shot, "%s/shot.png", dir);
  snprintf(check, sizeof check, "%s/check.html", dir);
  write_profile(ctx, trace);
  char *html = nb_test_read_file(page, NULL);
  CHECK_MSG(html && strstr(html, "<svg id='roofline'") && strstr(html, "params/w") && !strstr(html, "<script src") && !strstr(html, "<link"),
            "%s: not a self-contained page with a roofline", page);
  free(html);

  /* the screenshot; Chromium's own sandbox needs namespaces a container may not give */
  static const char flags[] = "--headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run --user-data-dir=";
  snprintf(cmd, sizeof cmd, "timeout 120 '%s' %s'%s/profile' --window-size=1000,1000 --screenshot='%s' 'file://%s' >'%s/shot.log' 2>&1",
           chromium, flags, dir, shot, page, dir);
  int rc = system(cmd);
  size_t n = 0;
  unsigned char *png = (unsigned char *)nb_test_read_file(shot, &n);
  CHECK_MSG(rc == 0 && png && n > 8 && !memcmp(png, "\x89PNG", 4), "%s: rc %d, no PNG (see %s/shot.log)", chromium, rc, dir);
  char *b64 = png ? base64(png, n) : NULL;
  FILE *f = b64 ? fopen(check, "w") : NULL;
  if (f) {
    fprintf(f, "<!DOCTYPE html><html><body><img id='s' src='data:image/png;base64,%s'>%s</body></html>\n", b64, checker);
    fclose(f);
  }
  free(b64);
  free(png);
  char out[1 << 16] = "";
  snprintf(cmd, sizeof cmd, "timeout 120 '%s' %s'%s/check' --virtual-time-budget=3000 --dump-dom 'file://%s' 2>/dev/null", chromium,
           flags, dir, check);
  FILE *p = popen(cmd, "r");
  size_t got = p ? fread(out, 1, sizeof out - 1, p) : 0;
  if (p) pclose(p);
  out[got] = 0;
  const char *r = strstr(out, "RESULT ");
  long w = 0, h = 0, colours = 0, nonwhite = 0, red = 0, blue = 0;
  CHECK_MSG(r && sscanf(r, "RESULT %ld %ld %ld %ld %ld %ld", &w, &h, &colours, &nonwhite, &red, &blue) == 6, "no counts from %s: %.300s",
            chromium, out);
  printf("screenshot %ldx%ld: %ld colours, %ld non-white pixels, %ld red, %ld blue\n", w, h, colours, nonwhite, red, blue);
  CHECK_MSG(w == 1000 && h == 1000, "%ldx%ld", w, h);
  CHECK_MSG(colours > 100 && nonwhite > w * h / 50, "blank: %ld colours, %ld non-white pixels", colours, nonwhite);
  CHECK_MSG(red > 50 && blue > 50, "the roofline's points are not drawn: %ld red, %ld blue pixels", red, blue);
  nb_ctx_destroy(ctx);
  if (!nb_test_failures) nb_test_rm_rf(dir);
  return nb_test_summary("prof/test_profile_html");
}
