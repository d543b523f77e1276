/* nabla dist: many processes as one job (the analogue of JAX's
 * multi-controller runtime), over MPI (Open MPI from Debian). Every process
 * runs the same program (SPMD, launched by `mpirun -np N`); a mesh names
 * axes over the processes (data=2, ...) and gives each axis a communicator,
 * which nb_dist_mesh_bind binds to a context for the collectives of
 * nabla/collective.h (psum, all_gather, ... and shard_map).
 *
 * The communicators implement the core's nb_comm interface
 * (nabla/collective.h); an NCCL implementation for GPUs will implement the
 * same interface later. Their collectives are point-to-point messages on a
 * private duplicate of the communicator, waited for with a deadline:
 *  - deterministic: reductions gather every rank's values and fold them in
 *    rank order (never MPI_Allreduce, whose order MPI does not fix), so a sum
 *    is bit-identical on every rank and from run to run;
 *  - bounded: a collective that waits longer than the communicator's
 *    timeout_s (NABLA_DIST_TIMEOUT seconds, default 120; nb_comm.timeout_s)
 *    ends the whole job (MPI_Abort) with a message naming the rank(s) it
 *    waited for. A process that exits is noticed by mpirun, which ends the
 *    job and names it.
 * Only this library links MPI; the core calls it through nb_comm.
 * Sharding rules (below: path regex -> partition spec, and the layouts and
 * blocks they give a tree) need no MPI and are built without it too.
 * Asynchronous too (allgather/allreduce/reduce_scatter _start, test, wait):
 * a compiled step starts them early and waits late, polling between steps
 * (NABLA_DIST_PROGRESS=none: no polling, for measurements; docs/dist.md).
 *
 *   nb_dist_init(ctx, &argc, &argv);
 *   const char *axes[] = {"data"};
 *   int64_t sizes[] = {-1};                         // -1: all the processes
 *   nb_dist_mesh *m = nb_dist_mesh_create(ctx, 1, axes, sizes);
 *   nb_dist_mesh_bind(m, ctx);                      // psum(x, "data") now runs over MPI
 *   ...
 *   nb_dist_mesh_destroy(m);
 *   nb_dist_finalize();
 */
#ifndef NABLA_DIST_H
#define NABLA_DIST_H

#include "nabla/export.h"
#include "nabla/core.h"

NB_BEGIN_DECLS

/* Starts MPI once per process (later calls do nothing); argc/argv may be
 * NULL. Fails when the process was not started in a way MPI accepts. */
nb_status nb_dist_init(nb_ctx *ctx, int *argc, char ***argv);
/* Ends MPI (after every communicator is destroyed). */
void nb_dist_finalize(void);
/* The job's rank and size (0 and 1 before nb_dist_init). */
int nb_dist_rank(void);
int nb_dist_size(void);
/* Ends every process of the job with msg on stderr (MPI_Abort). */
void nb_dist_abort(int code, const char *msg);

/* A communicator over all the job's processes (its own duplicate: its
 * messages never meet another's). Destroy with nb_dist_comm_destroy. */
nb_comm *nb_dist_world(nb_ctx *ctx);
void nb_dist_comm_destroy(nb_comm *c);

/* A mesh: named axes whose sizes multiply to the job's size (one size may
 * be -1: what is left), over the ranks in row-major order (the last axis
 * varies fastest), with one communicator per axis (the processes that
 * differ only along it). */
typedef struct nb_dist_mesh nb_dist_mesh;
nb_dist_mesh *nb_dist_mesh_create(nb_ctx *ctx, int naxes, const char *const *names, const int64_t *sizes);
void nb_dist_mesh_destroy(nb_dist_mesh *m);
int nb_dist_mesh_naxes(const nb_dist_mesh *m);
const char *nb_dist_mesh_axis_name(const nb_dist_mesh *m, int i);
int64_t nb_dist_mesh_axis_size(const nb_dist_mesh *m, int i);
/* The communicator of the named axis (owned by the mesh), or NULL. */
nb_comm *nb_dist_mesh_axis(const nb_dist_mesh *m, const char *name);
/* Binds every axis of m on ctx (nb_ctx_bind_axis). */
nb_status nb_dist_mesh_bind(const nb_dist_mesh *m, nb_ctx *ctx);

/* ---------------------------------------------------------------- sharding rules
 *
 * Which dims of a tree's leaves (parameters, optimizer state) are split
 * over which mesh axes, chosen by path: JAX's PartitionSpec per array, and
 * the (regex, spec) partition rules MaxText and EasyLM match against
 * parameter paths. Needs no MPI: it only computes layouts and blocks.
 *
 * A rule is a PCRE2 regex matched against the whole path (Python's
 * re.fullmatch, as the quantization rules' module paths) and a spec: per
 * dim, the mesh axis the dim is split over or NULL (JAX's
 * P('fsdp', None)). A spec shorter than a leaf's rank leaves the trailing
 * dims replicated (P('fsdp') on a matrix is P('fsdp', None)); the empty
 * spec replicates every dim; a spec longer than the rank is an error. An
 * axis splits at most one dim of a spec. The first rule that matches a path
 * wins; a leaf no rule matches is replicated (JAX's default).
 *
 * A dim of size d split over an axis of n processes is n blocks of d / n:
 * d must be a multiple of n, unless the axis is `padded` (nabla's FSDP):
 * then blocks of ceil(d / n), the last ones padded with zeros. Process
 * coordinate c along the axis holds block c.
 *
 *   nb_dist_rules *r = nb_dist_rules_create(ctx, "rules");
 *   const char *rows[] = {"fsdp"};
 *   nb_dist_rules_add(r, ".*embed.*", 0, NULL);           // whole on every process
 *   nb_dist_rules_add(r, ".*", 1, rows);                    // dim 0 over fsdp
 *   nb_dist_axis axes[] = {{"data", 2}, {"fsdp", 4, true}};
 *   nb_dist_layout *l = nb_dist_rules_apply(r, ctx, params, 2, axes);
 *   int64_t coords[] = {data_index, fsdp_index};
 *   nb_tree *mine = nb_dist_layout_shards(l, ctx, params, NULL, coords);
 *
 * Errors name the rule as "<label>[i]" (the label given at creation:
 * "mesh.rules" in a run config), its field and the leaf. */

typedef struct nb_dist_rules nb_dist_rules;
/* An empty list; label (copied; NULL: "rules") names it in messages. */
nb_dist_rules *nb_dist_rules_create(nb_ctx *ctx, const char *label);
void nb_dist_rules_destroy(nb_dist_rules *r); /* NULL ok */
/* Appends (regex, spec[0 .. n)) as the last rule (spec may be NULL when n
 * is 0). Refuses a regex that does not compile, an empty or too long axis
 * name, n outside 0..NB_MAX_RANK and an axis named twice. */
nb_status nb_dist_rules_add(nb_dist_rules *r, const char *regex, int n, const char *const *spec);
/* A list from YAML text: a sequence of [regex, [axis|null, ...]] pairs,
 *   [[".*embed.*", []], [".*mlp.*kernel", [null, tensor]], [".*", [fsdp]]]
 * (block style too). null or ~ is a replicated dim; a quoted "null" is an
 * axis named null. Other shapes ({path: ..., spec: [...]} maps, a bare axis
 * for the spec) are refused naming the entry: "mesh.rules[1]: ...". */
nb_dist_rules *nb_dist_rules_parse_yaml(nb_ctx *ctx, const char *label, const char *text, size_t len);
int nb_dist_rules_count(const nb_dist_rules *r);
const char *nb_dist_rules_label(const nb_dist_rules *r);
/* Rule i's regex and spec (*n its length); valid until r is destroyed. */
const char *nb_dist_rules_regex(const nb_dist_rules *r, int i);
nb_part_spec nb_dist_rules_spec(const nb_dist_rules *r, int i, int *n);
/* The index of the first rule whose regex matches the whole path, or -1. */
int nb_dist_rules_match(const nb_dist_rules *r, const char *path);

/* A mesh axis as the rules see it. */
typedef struct nb_dist_axis {
  const char *name;
  int64_t size;
  bool padded; /* a dim split over it need not be a multiple of size (zero padding) */
} nb_dist_axis;
/* Every axis the rules name is one of axes[0 .. naxes): else an error
 * naming the rule, the spec's entry and the axes there are. */
nb_status nb_dist_rules_check_axes(const nb_dist_rules *r, nb_ctx *ctx, int naxes, const nb_dist_axis *axes);

/* A layout: per leaf path, its whole aval, the rule that gave its spec and
 * the spec at its rank, over a mesh's axes. */
typedef struct nb_dist_layout nb_dist_layout;
/* An empty layout over axes[0 .. naxes) (copied). */
nb_dist_layout *nb_dist_layout_create(nb_ctx *ctx, int naxes, const nb_dist_axis *axes);
void nb_dist_layout_destroy(nb_dist_layout *l); /* NULL ok */
/* Adds the leaf `path` of aval `whole` with rule `rule` of r (-1 or r
 * NULL: replicated). Errors: the path is there already; the spec is longer
 * than the rank; it names an axis the layout lacks; a split dim is not a
 * multiple of its axis's size (unpadded axes). */
nb_status nb_dist_layout_add(nb_dist_layout *l, const char *path, nb_aval whole, const nb_dist_rules *r, int rule);
/* Every leaf of t (arrays or avals) with the first rule that matches its
 * path: a new layout, or NULL with the error of the first leaf refused. */
nb_dist_layout *nb_dist_rules_apply(const nb_dist_rules *r, nb_ctx *ctx, const nb_tree *t, int naxes, const nb_dist_axis *axes);
size_t nb_dist_layout_size(const nb_dist_layout *l);
/* The leaf's index, or -1. */
int64_t nb_dist_layout_find(const nb_dist_layout *l, const char *path);
/* Leaf i's path, rule (-1: none matched), spec (whole.shape.rank entries:
 * an axis name or NULL; valid until l is destroyed), whole aval and the
 * aval of one block (split dims divided, rounded up on padded axes). */
const char *nb_dist_layout_path(const nb_dist_layout *l, size_t i);
int nb_dist_layout_rule(const nb_dist_layout *l, size_t i);
nb_part_spec nb_dist_layout_spec(const nb_dist_layout *l, size_t i);
nb_aval nb_dist_layout_whole(const nb_dist_layout *l, size_t i);
nb_aval nb_dist_layout_block(const nb_dist_layout *l, size_t i);
/* The dim of leaf i split over axis, or -1. */
int nb_dist_layout_dim(const nb_dist_layout *l, size_t i, const char *axis);
/* The blocks of a tree: t's leaf p is the layout's "prefix/p" (prefix NULL
 * or "": p). An aval leaf becomes its block's aval; an array leaf the block
 * at coords (the process's index along each of the layout's axes, in their
 * order; zeros past a padded dim's end) as a new array, or the same array
 * (retained) when no dim is split. A new tree, or NULL with an error naming
 * a leaf the layout lacks, of another shape, or a traced value. */
nb_tree *nb_dist_layout_shards(const nb_dist_layout *l, nb_ctx *ctx, const nb_tree *t, const char *prefix,
                               const int64_t *coords);
/* One line per leaf to f: path, whole aval, the rule (index and regex) or
 * "no rule", the spec and the block's aval. r: the rules the layout came
 * from (NULL: indexes only). */
void nb_dist_layout_print(const nb_dist_layout *l, const nb_dist_rules *r, FILE *f);

/* "[fsdp, null]" for spec[0 .. n) into buf (always NUL-terminated); returns buf. */
char *nb_dist_spec_str(int n, nb_part_spec spec, char *buf, size_t cap);
/* Elements [lo, lo + n) of a along dim, zeros where that passes a's end:
 * a new array (a block of a split dim; also a padded block cut to size). */
nb_array *nb_dist_block(nb_ctx *ctx, const nb_array *a, int dim, int64_t lo, int64_t n);

NB_END_DECLS
#endif
