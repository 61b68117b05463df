/* Running text out of dictionary markup (see axi_text_clean in text-impl.h).
 *
 * The input is processed line by line. Paragraphs are runs of non-blank
 * lines; each becomes one output line. Square brackets may span lines
 * within a paragraph (etymologies do), so the bracket depth is carried from
 * line to line and reset at each paragraph end. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "axon/models/data/text-impl.h"

typedef struct cleaner {
  char *out;
  size_t n;
  int depth; /* open '[' not yet closed in this paragraph */
} cleaner;

static int is_mark(char c) { return c && strchr("'`\"=^~,.-*", c) != NULL; }

static int all_alpha(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isalpha((unsigned char)s[i]))
      return 0;
  return n > 0;
}

/* The letters a GCIDE accent code stands for, written into letters (at most
 * 4 bytes): ['e], [=oo], [.a] and [a^] keep their letters, ligatures [ae]
 * and [oe] stay, a few named symbols ([imac], [eth], ...) become their
 * nearest letters. Returns 0 when the bracket content s[0..n) is no accent
 * code (a note like [R.] or [1913 Webster], which is dropped). */
static int accent_letters(const char *s, size_t n, char *letters) {
  static const struct {
    const char *code, *text;
  } named[] = {{"imac", "i"}, {"aum", "a"}, {"eth", "th"}, {"th", "th"},
               {"ng", "ng"},  {"udd", "u"}, {"yogh", "y"}, {"ae", "ae"},
               {"oe", "oe"},  {"AE", "AE"}, {"OE", "OE"}};
  for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
    if (strlen(named[i].code) == n && memcmp(named[i].code, s, n) == 0) {
      memcpy(letters, named[i].text, strlen(named[i].text));
      return (int)strlen(named[i].text);
    }
  if (n >= 2 && n <= 3 && is_mark(s[0]) && all_alpha(s + 1, n - 1)) {
    memcpy(letters, s + 1, n - 1);
    return (int)n - 1;
  }
  if (n >= 2 && n <= 3 && s[n - 1] == '^' && all_alpha(s, n - 1)) {
    memcpy(letters, s, n - 1);
    return (int)n - 1;
  }
  return 0;
}

/* Decodes the entity whose name is s[0..n) (without & and ;) into out;
 * returns the bytes written (a space for unknown names). */
static int entity(const char *s, size_t n, char *out) {
  static const struct {
    const char *name;
    char c;
  } named[] = {{"amp", '&'},   {"lt", '<'},   {"gt", '>'},    {"quot", '"'},
               {"apos", '\''}, {"nbsp", ' '}, {"mdash", '-'}, {"ndash", '-'}};
  for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
    if (strlen(named[i].name) == n && memcmp(named[i].name, s, n) == 0) {
      out[0] = named[i].c;
      return 1;
    }
  if (n >= 2 && s[0] == '#') {
    long v = strtol(s + 1, NULL, 10);
    out[0] = v > 32 && v < 127 ? (char)v : ' ';
    return 1;
  }
  /* Accented letters (&eacute;, &uuml;, &aelig; ...) keep their base. */
  static const char *const suffix[] = {"acute", "grave", "circ", "uml",
                                       "tilde", "cedil", "ring", "slash"};
  for (size_t i = 0; i < sizeof suffix / sizeof suffix[0]; i++) {
    size_t k = strlen(suffix[i]);
    if (n == k + 1 && memcmp(s + 1, suffix[i], k) == 0 &&
        isalpha((unsigned char)s[0])) {
      out[0] = s[0];
      return 1;
    }
  }
  if (n == 5 && memcmp(s + 2, "lig", 3) == 0) {
    out[0] = s[0];
    out[1] = s[1];
    return 2;
  }
  out[0] = ' ';
  return 1;
}

/* Appends the cleaned bytes of one line s[0..len). */
static void clean_line(cleaner *c, const char *s, size_t len) {
  for (size_t i = 0; i < len; i++) {
    char ch = s[i];
    if (c->depth > 0) {
      c->depth += ch == '[' ? 1 : ch == ']' ? -1 : 0;
      continue;
    }
    if (ch == '[') {
      const char *close = memchr(s + i + 1, ']', len - i - 1);
      char letters[4];
      int k = close ? accent_letters(s + i + 1, (size_t)(close - s - i - 1),
                                     letters)
                    : 0;
      if (k > 0) {
        memcpy(c->out + c->n, letters, (size_t)k);
        c->n += (size_t)k;
        i = (size_t)(close - s);
      } else {
        c->depth = 1;
      }
      continue;
    }
    if (ch == ']' || ch == '{' || ch == '}')
      continue;
    if (ch == '\\') { /* a pronunciation span \Ac*cred"it\ */
      const char *end = memchr(s + i + 1, '\\', len - i - 1);
      i = end ? (size_t)(end - s) : len;
      continue;
    }
    if (ch == '<' && i + 1 < len &&
        (isalpha((unsigned char)s[i + 1]) || s[i + 1] == '/' ||
         s[i + 1] == '!')) {
      const char *end = memchr(s + i + 1, '>', len - i - 1);
      if (end) {
        c->out[c->n++] = ' ';
        i = (size_t)(end - s);
        continue;
      }
    }
    if (ch == '&') {
      size_t j = i + 1;
      while (j < len && j - i <= 10 &&
             (isalnum((unsigned char)s[j]) || s[j] == '#'))
        j++;
      if (j < len && s[j] == ';' && j > i + 1) {
        c->n += (size_t)entity(s + i + 1, j - i - 1, c->out + c->n);
        i = j;
        continue;
      }
    }
    c->out[c->n++] = (ch == '\t' || ch == '\r' || ch == '\f') ? ' ' : ch;
  }
}

/* Tidies the cleaned line out[from..n): drops leading blanks and sense
 * numbers ("2.", "(b)"), cuts a trailing citation ("--Shak."). */
static void tidy_line(cleaner *c, size_t from) {
  char *s = c->out + from;
  size_t n = c->n - from, a = 0;
  for (;;) {
    while (a < n && s[a] == ' ')
      a++;
    size_t b = a;
    while (b < n && b - a < 3 && isdigit((unsigned char)s[b]))
      b++;
    if (b > a && b < n && s[b] == '.' && (b + 1 == n || s[b + 1] == ' ')) {
      a = b + 1;
      continue;
    }
    if (a + 2 < n && s[a] == '(' && isalnum((unsigned char)s[a + 1]) &&
        s[a + 2] == ')') {
      a += 3;
      continue;
    }
    break;
  }
  for (size_t i = a; i + 2 < n; i++)
    if (s[i] == '-' && s[i + 1] == '-' && isupper((unsigned char)s[i + 2])) {
      n = i;
      break;
    }
  while (n > a && s[n - 1] == ' ')
    n--;
  memmove(s, s + a, n - a);
  c->n = from + (n - a);
}

/* Whether a line starts with a pronunciation: "(ab*dom`i*nos"ko*py), n." */
static int pronunciation(const char *s, size_t len) {
  if (len == 0 || s[0] != '(')
    return 0;
  for (size_t i = 1; i < len && s[i] != ')'; i++)
    if (s[i] == '*' || s[i] == '`' || s[i] == '"')
      return 1;
  return 0;
}

static int starts(const char *s, size_t len, const char *p) {
  size_t k = strlen(p);
  return len >= k && memcmp(s, p, k) == 0;
}

char *axi_text_clean(const char *src, size_t len, size_t *out_len) {
  cleaner c = {malloc(len + 2), 0, 0};
  if (!c.out)
    return NULL;
  int first = 1, skip = 0, head = 0;
  size_t para_start = 0;
  for (size_t pos = 0; pos <= len;) {
    const char *nl = pos < len ? memchr(src + pos, '\n', len - pos) : NULL;
    size_t end = nl ? (size_t)(nl - src) : len;
    const char *line = src + pos;
    size_t ll = end - pos, ind = 0;
    while (ind < ll && isspace((unsigned char)line[ind]))
      ind++;
    if (ind == ll) { /* a blank line (or the end) closes the paragraph */
      while (c.n > para_start && c.out[c.n - 1] == ' ')
        c.n--;
      if (c.n > para_start)
        c.out[c.n++] = '\n';
      para_start = c.n;
      first = 1;
      skip = 0;
      head = 0;
      c.depth = 0;
    } else {
      if (first) {
        const char *t = line + ind;
        size_t tl = ll - ind;
        skip = starts(t, tl, "00-") || starts(t, tl, "Syn:") ||
               starts(t, tl, "Ant:");
        first = 0;
      }
      if (!skip) {
        size_t from = c.n;
        /* A headword line ("Accredit \Ac*cred"it\, v. t. [...") starts at
         * column 0 and holds a pronunciation span. It and the lines that
         * continue its pronunciation or etymology are dropped; only their
         * brackets count. */
        if (ind == 0 && memchr(line, '\\', ll))
          head = 1;
        else if (head && c.depth == 0 && !pronunciation(line + ind, ll - ind))
          head = 0;
        clean_line(&c, line, ll);
        if (head)
          c.n = from;
        tidy_line(&c, from);
        if (c.n > from)
          c.out[c.n++] = ' ';
      }
    }
    if (!nl)
      break;
    pos = end + 1;
  }
  while (c.n > para_start && c.out[c.n - 1] == ' ')
    c.n--;
  if (c.n > para_start)
    c.out[c.n++] = '\n';
  c.out[c.n] = '\0';
  *out_len = c.n;
  return c.out;
}
