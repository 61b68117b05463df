/* axon-run train with checkpoints: --checkpoint-dir DIR, --checkpoint-every
 * N, --resume DIR and --loss-log FILE (runtime/pipeline/state/checkpoint.h has
 * what is saved and the consistent cut; docs/CHECKPOINTS.md the files). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agents/axon_run.h"
#include "axon/kernels/clock.h"
#include "axon/runtime/pipeline/schedule/partition.h"
#include "axon/runtime/pipeline/stage/staleness.h"
#include "axon/runtime/pipeline/state/checkpoint.h"
#include "axon/runtime/pipeline/state/freeze.h"
#include "axon/runtime/pipeline/state/recover.h"

/* Steps between two looks for a dropped replica's agent (--elastic). */
#define AXR_GROW_EVERY 5

typedef struct wrap { /* ax_pipe_train's callbacks around the feed's */
  const axi_run_feed *feed;
  FILE *loss_log;
  long done; /* steps of the run completed (the last step's index + 1) */
} wrap;

static int w_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  wrap *w = user;
  return w->feed->batch(w->feed->user, t, in, lab);
}

static void w_step(void *user, const ax_pipe_step_info *s) {
  wrap *w = user;
  if (w->loss_log) /* every bit of the loss, to compare runs */
    fprintf(w->loss_log, "%ld %.17g\n", s->batch, s->loss);
  w->done = s->batch + 1;
  if (w->loss_log) /* whole lines, so a watcher sees each step */
    fflush(w->loss_log);
  w->feed->step(w->feed->user, s);
}

/* Moves the data to the checkpoint's step (from where, for messages): *start
 * is that step. */
static int seek_to(const axi_run_feed *feed, const ax_ckpt_info *info,
                   const char *why, const char *from, long *start) {
  long e, b;
  AX_TRY(feed->seek(feed->user, info->step, 1, &e, &b));
  if (e != info->data_epoch || b != info->data_batch)
    return ax_seterr(AX_EINVAL,
                     "%s %s: step %ld is batch %ld of "
                     "epoch %ld here, batch %ld of epoch %ld in the "
                     "checkpoint's run",
                     why, from, info->step, b, e, info->data_batch,
                     info->data_epoch);
  fprintf(stderr, "axon-run: %s from %s at step %ld\n",
          strcmp(why, "--resume") ? "rolled back" : "resumed", from,
          info->step);
  *start = info->step;
  return AX_OK;
}

/* --freeze-schedule: the point at step t, if any, is applied: the pipeline
 * re-packed (freeze.h), with the phase that ends here reported. */
typedef struct freezer {
  ax_freeze_point pt[16];
  int n, next;
  double phase_s; /* training seconds since the last freeze */
  long phase_from;
} freezer;

static int freeze_at(const axi_run_pipe_args *a, ax_pipe **pp,
                     const axi_run_feed *feed, freezer *fz, long t, int quiet) {
  if (fz->next >= fz->n || fz->pt[fz->next].step != t)
    return AX_OK;
  const ax_freeze_point *pt = &fz->pt[fz->next++];
  ax_freeze_stats before, after;
  ax_pipe_freeze_stats(*pp, &before);
  int64_t mb = a->freeze_cache_mb;
  ax_freeze_opts fo = {pt->blocks, pt->K, mb < 0 ? -1 : mb * (1 << 20)};
  double t0 = ax_clock_s();
  AX_TRY(ax_pipe_freeze(pp, &fo));
  ax_pipe_freeze_stats(*pp, &after);
  long steps = t - fz->phase_from;
  if (!quiet)
    fprintf(stderr,
            "axon-run: freeze at step %ld: blocks 0..%d frozen, "
            "re-packed from %d agents x %d replicas to %d x %d in %.2f s "
            "(the phase before: %ld steps, %.1f samples/s; cache %ld hits, "
            "%ld misses)\n",
            t, pt->blocks - 1, before.K, before.replicas, after.K,
            after.replicas, ax_clock_s() - t0, steps,
            fz->phase_s > 0 ? (double)(steps * a->batch) / fz->phase_s : 0.0,
            before.hits, before.misses);
  fz->phase_s = 0;
  fz->phase_from = t;
  if (feed->repacked)
    feed->repacked(feed->user, *pp);
  return AX_OK;
}

/* A pipeline just built, with nothing frozen, frozen as the run's was at
 * step `step` (a checkpoint's, which holds the frozen prefix: --resume and
 * the rollback of a lost agent restore it onto that layout): the
 * schedule's points up to it applied, the later ones still to come. */
static int refreeze(const axi_run_pipe_args *a, ax_pipe **pp,
                    const axi_run_feed *feed, freezer *fz, long step) {
  fz->next = 0;
  while (fz->next < fz->n && fz->pt[fz->next].step <= step)
    AX_TRY(freeze_at(a, pp, feed, fz, fz->pt[fz->next].step, 1));
  fz->phase_s = 0;
  fz->phase_from = step;
  return AX_OK;
}

/* Loads the newest checkpoint at `path` (or that one) into the pipeline *pp
 * (just built: frozen first as the checkpoint's was) and moves the data
 * there: *start is its step. */
static int restore(const axi_run_pipe_args *a, ax_pipe **pp,
                   const axi_run_feed *feed, freezer *fz, const char *path,
                   const char *why, long *start) {
  char dir[1024], cfg[2048];
  ax_ckpt_info info;
  AX_TRY(ax_ckpt_find(path, dir, sizeof dir));
  axi_run_config(a, cfg, sizeof cfg);
  int err = ax_ckpt_read_info(dir, &info);
  if (err == AX_OK)
    err = axi_run_same_config(dir, info.config, cfg);
  if (err == AX_OK)
    err = refreeze(a, pp, feed, fz, info.step);
  double t0 = ax_clock_s();
  if (err == AX_OK)
    err = ax_pipe_restore(*pp, dir, &info);
  if (err == AX_OK)
    fprintf(stderr, "axon-run: the checkpoint's state loaded in %.3f s\n",
            ax_clock_s() - t0);
  if (err != AX_OK) {
    char m[1500], prev[1024];
    snprintf(m, sizeof m, "%s", ax_errmsg());
    ax_ckpt_previous(dir, prev, sizeof prev);
    if (prev[0] && (err == AX_EFORMAT || err == AX_EIO))
      return ax_seterr(err,
                       "%s (the previous checkpoint %s is complete: "
                       "--resume %s)",
                       m, prev, prev);
    return ax_seterr(err, "%s", m);
  }
  return seek_to(feed, &info, why, dir, start);
}

/* Rolls the pipeline *pp (just built) back to the in-memory checkpoint m
 * (the stages' copies on their agents or their neighbours', or a
 * replica's: from = "memory" or "live") and moves the data there. */
static int restore_memory(const axi_run_pipe_args *a, ax_pipe **pp,
                          const axi_run_feed *feed, freezer *fz,
                          const ax_mem_ckpt *m, const char *why,
                          const char *from, long *start) {
  ax_ckpt_info info;
  AX_TRY(refreeze(a, pp, feed, fz, m->info.step));
  AX_TRY(ax_pipe_restore_memory(*pp, m, &info));
  return seek_to(feed, &info, why, from, start);
}

/* Before the rebuild of a replicated run of a flushed mode: the stages of
 * the lost agents (feed->lost) will take a live replica's state, every
 * survivor stopped at one step boundary and copied in memory (recover.h);
 * `reached`: the first step not reported done. AX_OK when *live holds
 * that copy; else the reason is printed and a checkpoint serves. */
static int live_prepare(ax_pipe *p, const axi_run_feed *feed, ax_mem_ckpt *live,
                        long reached) {
  const char *lost[2 * AX_PIPE_MAX_STAGES];
  int n = live && feed->lost ? feed->lost(feed->user, lost, 32) : 0;
  if (!n)
    return AX_ENOTFOUND;
  int rc = ax_pipe_live_snapshot(p, lost, n, reached, live);
  if (rc != AX_OK)
    fprintf(stderr, "axon-run: no live recovery (%s); from a checkpoint\n",
            ax_errmsg());
  if (rc == AX_OK)
    rc = feed->seek(feed->user, live->info.step, 0, &live->info.data_epoch,
                    &live->info.data_batch);
  return rc;
}

/* Rolls the rebuilt pipeline *pp back to the newest checkpoint: in memory
 * when it holds the newest step, else of --checkpoint-dir (or --resume),
 * or to the run's start (first) when none was written yet, frozen as the
 * run was there. *t: that step. */
static int rollback(const axi_run_pipe_args *a, ax_pipe **pp,
                    const axi_run_feed *feed, freezer *fz,
                    const ax_mem_ckpt *mem, long first, long *t) {
  char dir[1024];
  const char *why = a->nspares    ? "--spares"
                    : a->restarts ? "--restarts"
                                  : "--elastic";
  ax_ckpt_info disk;
  int on_disk = a->ckpt_dir &&
                ax_ckpt_find(a->ckpt_dir, dir, sizeof dir) == AX_OK &&
                ax_ckpt_read_info(dir, &disk) == AX_OK;
  int rc = AX_ENOTFOUND; /* from memory when it holds the newest step */
  if (mem && mem->S > 0 && (!on_disk || mem->info.step >= disk.step)) {
    rc = restore_memory(a, pp, feed, fz, mem, why, "memory", t);
    if (rc != AX_OK && !on_disk) /* that step's only copy is gone */
      return rc;
    if (rc != AX_OK)
      fprintf(stderr, "axon-run: no rollback from memory (%s); from disk\n",
              ax_errmsg());
  }
  if (rc != AX_OK && on_disk)
    return restore(a, pp, feed, fz, a->ckpt_dir, why, t);
  if (rc != AX_OK && a->resume)
    return restore(a, pp, feed, fz, a->resume, why, t);
  if (rc != AX_OK) { /* no checkpoint yet: the run's start */
    *t = first;
    AX_TRY(refreeze(a, pp, feed, fz, first));
    return feed->seek(feed->user, first, 1, &(long){0}, &(long){0});
  }
  return AX_OK;
}

/* A stage agent was lost during the training call that had reached step
 * `reached`: the pipeline is rebuilt on a spare or on the restarted agent
 * (feed->rebuild). With replicas of a flushed mode the lost stages take a
 * live replica's state and no step is lost (live_prepare); else every
 * stage rolls back (rollback). An agent lost during the rollback (the
 * spare, or another stage's agent, dying while the state is handed over)
 * is replaced in turn while spares or restarts are left: feed->rebuild
 * gives up otherwise, and when no agent is lost. *t: the step training
 * goes on from. */
static int recover(const axi_run_pipe_args *a, ax_pipe **p,
                   const axi_run_feed *feed, freezer *fz,
                   const ax_mem_ckpt *mem, ax_mem_ckpt *live, int failure,
                   long first, long reached, long *t) {
  if (!feed->rebuild || (!a->nspares && !a->restarts && !a->elastic))
    return failure;
  double t0 = ax_clock_s();
  char failed[768];
  snprintf(failed, sizeof failed, "%s", ax_errmsg());
  /* A checkpoint still being written is complete or not before the
   * newest one is looked for (its failure is the lost agent's). */
  ax_pipe_checkpoint_wait(*p);
  int lv = live_prepare(*p, feed, live, reached);
  ax_seterr(failure, "%s", failed); /* what the rebuild reports */
  int rc = feed->rebuild(feed->user, failure, p);
  AX_TRY(rc);
  const char *why = a->nspares    ? "--spares"
                    : a->restarts ? "--restarts"
                                  : "--elastic";
  if (lv == AX_OK) {
    /* A replacement lost while it takes the state: the next one takes it
     * from the same survivors' copies. */
    while ((lv = restore_memory(a, p, feed, fz, live, why, "live", t)) !=
               AX_OK &&
           feed->rebuild(feed->user, lv, p) == AX_OK)
      ;
    if (lv == AX_OK) {
      fprintf(stderr,
              "axon-run: recovered live from the replicas in %.2f s; at "
              "step %ld, 0 steps lost (mini-batch %ld runs again)\n",
              ax_clock_s() - t0, *t, *t);
      if (*t > reached) /* updated on every stage, never reported */
        fprintf(stderr,
                "axon-run: steps %ld to %ld were applied but their "
                "losses not reported\n",
                reached, *t - 1);
      return AX_OK;
    }
    fprintf(stderr, "axon-run: no live recovery (%s); from a checkpoint\n",
            ax_errmsg());
  }
  while ((rc = rollback(a, p, feed, fz, mem, first, t)) != AX_OK &&
         (rc = feed->rebuild(feed->user, rc, p)) == AX_OK)
    ;
  AX_TRY(rc);
  fprintf(stderr,
          "axon-run: recovered in %.2f s; back at step %ld, %ld "
          "step(s) lost\n",
          ax_clock_s() - t0, *t, reached > *t ? reached - *t : 0);
  return AX_OK;
}

int axi_run_live(const axi_run_pipe_args *a) {
  /* Under ZeRO a lost replica's optimizer shard has no other copy: those
   * runs roll back to a checkpoint. */
  return a->replicas > 1 && (a->nspares || a->restarts || a->elastic) &&
         ax_pipe_flushes(a->mode) && !a->zero;
}

/* --elastic with --restarts: at step t, between two calls, the dropped
 * replicas' agents are all back: every stage's state is copied in memory
 * on its agent (a drained boundary), the pipeline is built anew with
 * every replica and each stage loads, a new replica's from a replica that
 * went on. */
static int grow(const axi_run_pipe_args *a, ax_pipe **p,
                const axi_run_feed *feed, freezer *fz, ax_mem_ckpt *live,
                long t) {
  double t0 = ax_clock_s();
  AX_TRY(ax_pipe_checkpoint_wait(*p));
  AX_TRY(ax_pipe_live_copy(*p, t, live));
  AX_TRY(feed->seek(feed->user, t, 0, &live->info.data_epoch,
                    &live->info.data_batch));
  AX_TRY(feed->grow(feed->user, p));
  AX_TRY(restore_memory(a, p, feed, fz, live, "--elastic", "live", &t));
  fprintf(stderr, "axon-run: grew back in %.2f s at step %ld\n",
          ax_clock_s() - t0, t);
  return AX_OK;
}

/* Checkpoint `step`: on disk under --checkpoint-dir, and into *mem (when
 * not NULL) in memory. */
static int save(const axi_run_pipe_args *a, ax_pipe *p,
                const axi_run_feed *feed, long step, ax_mem_ckpt *mem) {
  ax_ckpt_info in;
  memset(&in, 0, sizeof in);
  in.step = step;
  in.seed = a->seed;
  AX_TRY(feed->seek(feed->user, step, 0, &in.data_epoch, &in.data_batch));
  snprintf(in.model, sizeof in.model, "%s", a->model);
  snprintf(in.model_config, sizeof in.model_config, "%s",
           a->model_config ? a->model_config : "");
  snprintf(in.dataset, sizeof in.dataset, "%s", a->dataset);
  snprintf(in.data_config, sizeof in.data_config, "%s",
           a->data_config ? a->data_config : "");
  axi_run_config(a, in.config, sizeof in.config);
  if (mem) /* the stages' copies in memory, on their agents and neighbours */
    AX_TRY(ax_pipe_checkpoint_memory(p, &in, mem));
  if (!a->ckpt_dir)
    return AX_OK;
  /* The stages' files are written while training goes on (the manifest
   * follows them; the next checkpoint or the run's end waits). */
  return ax_pipe_checkpoint(p, a->ckpt_dir, &in, 2,
                            a->ckpt_to_coord ? AX_CKPT_TO_COORDINATOR
                                             : AX_CKPT_ASYNC);
}

int axi_run_train(const axi_run_pipe_args *a, ax_pipe **pp, long total,
                  const axi_run_feed *feed, long *start, double *seconds,
                  double *ckpt_s) {
  wrap w = {feed, NULL, 0};
  freezer fz = {.n = 0};
  if (a->freeze_schedule)
    AX_TRY(ax_freeze_schedule_parse(a->freeze_schedule, fz.pt, 16, &fz.n));
  *start = 0;
  *seconds = *ckpt_s = 0;
  if (a->resume)
    AX_TRY(restore(a, pp, feed, &fz, a->resume, "--resume", start));
  else
    AX_TRY(feed->seek(feed->user, 0, 1, &(long){0}, &(long){0}));
  if (*start >= total)
    return ax_seterr(AX_EINVAL,
                     "--resume: the checkpoint is at step %ld, "
                     "the run ends at step %ld",
                     *start, total);
  if (a->loss_log && !(w.loss_log = fopen(a->loss_log, *start ? "a" : "w")))
    return ax_seterr(AX_EIO, "--loss-log %s: cannot open", a->loss_log);
  long N =
      (a->ckpt_dir || a->ckpt_memory) && a->ckpt_every > 0 ? a->ckpt_every : 0;
  ax_mem_ckpt *mem = a->ckpt_memory ? calloc(1, sizeof *mem) : NULL;
  /* The survivors' copies of a live recovery (recover.h). */
  ax_mem_ckpt *live = axi_run_live(a) ? calloc(1, sizeof *live) : NULL;
  int err = (a->ckpt_memory && !mem) || (axi_run_live(a) && !live) ? AX_ENOMEM
                                                                   : AX_OK;
  for (long t = *start; err == AX_OK && t < total;) {
    long end = N ? (t / N + 1) * N : total; /* the next cut */
    long E = feed->every;
    if (E > 0 && (t / E + 1) * E < end)
      end = (t / E + 1) * E;
    if (fz.next < fz.n && fz.pt[fz.next].step < end)
      end = fz.pt[fz.next].step;
    /* Shrunk (--elastic), waiting for an agent: it is looked for after
     * every AXR_GROW_EVERY steps. */
    int shrunk = feed->can_grow ? feed->can_grow(feed->user) : -1;
    if (shrunk >= 0 && t + AXR_GROW_EVERY < end)
      end = t + AXR_GROW_EVERY;
    end = end < total ? end : total;
    double t0 = ax_clock_s();
    err = ax_pipe_train(*pp, end - t, w_batch, w_step, &w);
    *seconds += ax_clock_s() - t0;
    fz.phase_s += ax_clock_s() - t0;
    if (err != AX_OK) { /* a lost stage agent, with a spare left? */
      err = recover(a, pp, feed, &fz, mem, live, err, *start,
                    w.done > t ? w.done : t, &t);
      continue;
    }
    t = end;
    if (w.loss_log)
      fflush(w.loss_log);
    if (err == AX_OK && feed->segment)
      err = feed->segment(feed->user, t);
    if (err == AX_OK && t < total &&
        (err = freeze_at(a, pp, feed, &fz, t, 0)) != AX_OK) {
      /* an agent lost while the state moved? */
      err = recover(a, pp, feed, &fz, mem, live, err, *start, t, &t);
      continue;
    }
    if (err == AX_OK && t < total && shrunk >= 0 &&
        feed->can_grow(feed->user) > 0)
      err = grow(a, pp, feed, &fz, live, t);
    if (err == AX_OK && (a->ckpt_dir || mem) &&
        (N ? t % N == 0 || t == total : t == total)) {
      t0 = ax_clock_s();
      err = save(a, *pp, feed, t, mem);
      /* The last one's files are written before the run ends, so that an
       * agent lost while writing them is recovered from like any other. */
      if (err == AX_OK && t == total)
        err = ax_pipe_checkpoint_wait(*pp);
      *ckpt_s += ax_clock_s() - t0;
      if (err != AX_OK) /* lost while saving: the previous one is whole */
        err = recover(a, pp, feed, &fz, mem, live, err, *start, t, &t);
    }
  }
  if (mem && *pp)
    ax_pipe_memory_forget(*pp, mem);
  if (live && live->S > 0 && *pp)
    ax_pipe_memory_forget(*pp, live);
  free(mem);
  free(live);
  if (w.loss_log)
    fclose(w.loss_log);
  double w0 = ax_clock_s(); /* the last checkpoint's files, if still going */
  int werr = *pp ? ax_pipe_checkpoint_wait(*pp) : AX_OK;
  *ckpt_s += ax_clock_s() - w0;
  if (err == AX_OK)
    err = werr;
  if (err == AX_OK && fz.n && fz.phase_s > 0)
    fprintf(stderr, "axon-run: the last phase: %ld steps, %.1f samples/s\n",
            total - fz.phase_from,
            (double)((total - fz.phase_from) * a->batch) / fz.phase_s);
  return err;
}
