/* Futures: the outcome of an asynchronous call (or of any deferred work).
 *
 * A future is reference counted and thread-safe. It completes exactly once
 * with an error code (AX_OK on success), an optional message and, on
 * success, a value list. Completion callbacks registered with
 * ax_future_on_done run exactly once: on the completing thread, or at once
 * on the registering thread if the future is already complete. Callbacks
 * must not block (they may run on an I/O thread); they may issue new async
 * calls and complete other futures.
 *
 * Every wait takes a deadline. Futures returned by ax_rpc_async always
 * complete by their call deadline (AX_ETIMEOUT) or earlier, e.g. with
 * AX_EPEERDOWN when the peer dies. */
#ifndef AX_RPC_FUTURE_H
#define AX_RPC_FUTURE_H

#include <stdint.h>

#include "axon/rpc/value.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ax_future ax_future;
typedef void (*ax_future_cb)(ax_future *f, void *user);

/* A new pending future (a promise) with one reference; NULL on no memory. */
ax_future *ax_future_new(void);
ax_future *ax_future_retain(ax_future *f); /* returns f; NULL-safe */
void ax_future_release(ax_future *f);      /* NULL-safe */

/* Completes f. On success (err == AX_OK) the future takes ownership of vals
 * (which may be NULL for an empty result); on error vals is freed and msg
 * (may be NULL) is copied. Returns AX_ESTATE if f was already complete, in
 * which case vals is freed too. */
int ax_future_complete(ax_future *f, int err, ax_values *vals, const char *msg);

/* Waits up to timeout_ms (>= 0) for completion. Returns the future's code
 * when it completed in time, AX_ETIMEOUT otherwise (the future stays
 * pending). */
int ax_future_wait(ax_future *f, int64_t timeout_ms);

int ax_future_is_done(const ax_future *f);
/* The outcome; valid once done (AX_ESTATE while pending). */
int ax_future_err(const ax_future *f);
/* The error message ("" if none); valid while f is referenced. */
const char *ax_future_errmsg(const ax_future *f);
/* The result list (borrowed, may be NULL for an empty result); valid while
 * f is referenced, NULL while pending or on error. */
const ax_values *ax_future_values(const ax_future *f);
/* Moves the result list out (caller frees); later calls return NULL. */
ax_values *ax_future_take_values(ax_future *f);

/* Registers cb. Returns AX_OK (cb will run exactly once) or AX_ENOMEM (cb
 * never runs). */
int ax_future_on_done(ax_future *f, ax_future_cb cb, void *user);

/* A new future completed by `src` once it completes: same code, message
 * and a clone of its values. Handy to hand one outcome to two owners. */
ax_future *ax_future_follow(ax_future *src);

/* Number of live futures in this process (debug counter; tests assert it
 * returns to zero). */
long ax_future_live_count(void);

#ifdef __cplusplus
}
#endif
#endif
