/* axon error codes: one enum, 0 = OK, generated together with ax_strerror.
 *
 * This header is a leaf: it includes nothing of axon's and may be included
 * from every layer (kernels/ included). Library code returns these codes and
 * never exits; a failing call may leave a detail message for the calling
 * thread, read with ax_errmsg(). */
#ifndef AX_ERROR_H
#define AX_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, message) */
#define AX_ERRNO_MAP(X)                                                        \
  X(INVAL, "invalid argument")                                                 \
  X(NOMEM, "out of memory")                                                    \
  X(SHAPE, "shape mismatch")                                                   \
  X(DTYPE, "wrong data type")                                                  \
  X(DEVICE, "device error")                                                    \
  X(NODEV, "no such device")                                                   \
  X(IO, "input/output error")                                                  \
  X(FORMAT, "malformed or truncated data")                                     \
  X(NOTFOUND, "not found")                                                     \
  X(UNSUPPORTED, "operation not supported")                                    \
  X(STATE, "object in the wrong state for this call")                          \
  X(TIMEOUT, "deadline exceeded")                                              \
  X(PEERDOWN, "peer is down")                                                  \
  X(NOFUNC, "unknown function")                                                \
  X(MALFORMED, "malformed message")                                            \
  X(TOOBIG, "message too large")                                               \
  X(BADARG, "wrong argument type")                                             \
  X(REMOTE, "remote error")                                                    \
  X(CANCELLED, "cancelled")                                                    \
  X(CLOSED, "closed")                                                          \
  X(STALE, "stale handle")                                                     \
  X(CUDA, "CUDA error")                                                        \
  X(CUBLAS, "cuBLAS error")                                                    \
  X(CUDNN, "cuDNN error")                                                      \
  X(INTERNAL, "internal error")

typedef enum ax_err {
  AX_OK = 0,
#define AX_ERR_ENUM_(name, msg) AX_E##name,
  AX_ERRNO_MAP(AX_ERR_ENUM_)
#undef AX_ERR_ENUM_
      AX_ERR_MAX_
} ax_err;

/* A static message for an error code; never NULL ("unknown error" for codes
 * outside the enum). Thread-safe. */
const char *ax_strerror(int err);

/* The symbolic name of a code, e.g. "AX_ESHAPE". Never NULL. */
const char *ax_errname(int err);

/* Records a detail message for the calling thread (printf format) and returns
 * err, so library code can write `return ax_seterr(AX_ESHAPE, "...", ...)`.
 * A message longer than 511 bytes keeps its start and its end, joined by
 * " ... " (a remote error nested many calls deep keeps its cause). */
int ax_seterr(int err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The calling thread's last detail message, or "" if none. The pointer is
 * valid until the thread's next ax_seterr call. */
const char *ax_errmsg(void);

/* Clears the calling thread's detail message. */
void ax_clearerr(void);

/* Evaluates expr (an int-returning call) and returns its code on failure. */
#define AX_TRY(expr)                                                           \
  do {                                                                         \
    int ax_try_rc_ = (expr);                                                   \
    if (ax_try_rc_ != AX_OK)                                                   \
      return ax_try_rc_;                                                       \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif
