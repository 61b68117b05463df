/* The plugin loader (plugin.h): dlopen, the ABI check and the two phases of
 * axon_plugin_init. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "axon/runtime/autograd/plugin.h"

typedef struct plugin {
  void *handle;
  ax_plugin_init_fn init;
  char path[512];
} plugin;

/* Loaded plugins in load order; g_mu also serialises the inits. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static plugin g_plugins[AX_PLUGIN_MAX];
static int g_n;

/* dlopens path; on success *h holds the handle. */
static int open_file(const char *path, void **h) {
  char buf[sizeof g_plugins[0].path];
  struct stat st;
  *h = NULL;
  if (!path || !*path)
    return ax_seterr(AX_EINVAL, "plugin: no file given");
  if (strlen(path) + 2 >= sizeof buf)
    return ax_seterr(AX_EINVAL, "plugin %s: path too long", path);
  /* dlopen searches the library path for a bare name: make it a path. */
  snprintf(buf, sizeof buf, "%s%s", strchr(path, '/') ? "" : "./", path);
  if (stat(buf, &st) != 0)
    return ax_seterr(AX_ENOTFOUND, "plugin %s: no such file", path);
  dlerror();
  if (!(*h = dlopen(buf, RTLD_NOW | RTLD_LOCAL))) {
    const char *e = dlerror();
    return ax_seterr(AX_EIO, "plugin %s: cannot load: %s", path,
                     e ? e : "dlopen failed");
  }
  return AX_OK;
}

/* Looks the ABI and entry symbols up and checks the ABI. */
static int check_symbols(const char *path, void *h, ax_plugin_init_fn *init) {
  dlerror();
  const uint32_t *abi = dlsym(h, AX_PLUGIN_ABI_SYMBOL);
  if (!abi) {
    const char *e = dlerror();
    return ax_seterr(AX_EINVAL,
                     "plugin %s: no symbol %s, not an axon "
                     "plugin (%s)",
                     path, AX_PLUGIN_ABI_SYMBOL, e ? e : "NULL");
  }
  if (*abi != AX_PLUGIN_ABI)
    return ax_seterr(AX_EUNSUPPORTED,
                     "plugin %s: built for plugin ABI %u, "
                     "this axon has ABI %u: rebuild it against this axon's "
                     "headers",
                     path, (unsigned)*abi, (unsigned)AX_PLUGIN_ABI);
  dlerror();
  void *fn = dlsym(h, AX_PLUGIN_INIT_SYMBOL);
  if (!fn) {
    const char *e = dlerror();
    return ax_seterr(AX_EINVAL,
                     "plugin %s: no symbol %s, not an axon "
                     "plugin (%s)",
                     path, AX_PLUGIN_INIT_SYMBOL, e ? e : "NULL");
  }
  memcpy(init, &fn, sizeof fn); /* object to function pointer */
  return AX_OK;
}

/* Prefixes the thread's message with the plugin's path and the phase. */
static int init_failed(const char *path, const char *phase, int err) {
  char msg[400];
  snprintf(msg, sizeof msg, "%s", ax_errmsg());
  return ax_seterr(err, "plugin %s: %s: %s%s%s", path, phase, ax_strerror(err),
                   *msg ? ": " : "", msg);
}

int ax_plugin_load(const char *path) {
  void *h;
  AX_TRY(open_file(path, &h));
  pthread_mutex_lock(&g_mu);
  int err = AX_OK, i;
  for (i = 0; i < g_n && g_plugins[i].handle != h; i++)
    ;
  if (i < g_n) { /* already loaded: drop the extra reference */
    pthread_mutex_unlock(&g_mu);
    dlclose(h);
    return AX_OK;
  }
  ax_plugin_init_fn init = NULL;
  if (g_n == AX_PLUGIN_MAX)
    err = ax_seterr(AX_ENOMEM, "plugin %s: more than %d plugins", path,
                    AX_PLUGIN_MAX);
  if (err == AX_OK)
    err = check_symbols(path, h, &init);
  if (err != AX_OK) { /* nothing of it ran: it can go */
    pthread_mutex_unlock(&g_mu);
    dlclose(h);
    return err;
  }
  ax_clearerr();
  err = init(NULL);
  if (err != AX_OK) { /* it may have registered something: stays mapped */
    pthread_mutex_unlock(&g_mu);
    return init_failed(path, "init", err);
  }
  plugin *p = &g_plugins[g_n++];
  p->handle = h;
  p->init = init;
  snprintf(p->path, sizeof p->path, "%s", path);
  pthread_mutex_unlock(&g_mu);
  return AX_OK;
}

int ax_plugin_attach(ax_node *n) {
  if (!n)
    return ax_seterr(AX_EINVAL, "plugin attach: no node");
  int err = AX_OK;
  pthread_mutex_lock(&g_mu);
  for (int i = 0; err == AX_OK && i < g_n; i++) {
    ax_clearerr();
    err = g_plugins[i].init(n);
    if (err != AX_OK) {
      char phase[160];
      snprintf(phase, sizeof phase, "init on node %s", ax_node_name(n));
      err = init_failed(g_plugins[i].path, phase, err);
    }
  }
  pthread_mutex_unlock(&g_mu);
  return err;
}

int ax_plugin_count(void) {
  pthread_mutex_lock(&g_mu);
  int n = g_n;
  pthread_mutex_unlock(&g_mu);
  return n;
}
