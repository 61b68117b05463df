/* The word-level tokenizer and sentence splitter (see text-impl.h). */
#include <ctype.h>
#include <string.h>

#include "axon/models/data/text-impl.h"

#define TOK_MAX 48 /* longer words are cut to this many bytes */

static int word_byte(unsigned char c) { return isalnum(c) || c >= 0x80; }

/* Words after which a period does not end a sentence. */
static int abbreviation(const char *w, size_t n) {
  static const char *const abbr[] = {
      "mr",  "mrs", "ms",  "dr",  "st",  "sr",  "jr",   "prof", "rev",
      "vs",  "cf",  "fr",  "esp", "etc", "viz", "no",   "gen",  "gov",
      "lat", "gr",  "fig", "vol", "pp",  "ch",  "ibid", "sq",   "co"};
  if (n == 1)
    return 1; /* initials: "G. C. Lewis", "v. t." */
  for (size_t i = 0; i < sizeof abbr / sizeof abbr[0]; i++)
    if (strlen(abbr[i]) == n && memcmp(abbr[i], w, n) == 0)
      return 1;
  return 0;
}

/* Whether the terminator at s[i] ends a sentence; prev/plen is the word
 * right before it (plen 0 when a space or punctuation precedes it). */
static int ends_sentence(const char *s, size_t len, size_t i, const char *prev,
                         size_t plen) {
  size_t k = i + 1;
  while (k < len && isspace((unsigned char)s[k]))
    k++;
  if (k == len)
    return 1;
  unsigned char next = (unsigned char)s[k];
  if (s[i] == '.') {
    if (next == '.' || (plen && abbreviation(prev, plen)))
      return 0;
  }
  return isupper(next) || next == '"' || next == '(' || next == '\'';
}

void axi_tokenize_line(const char *s, size_t len,
                       void (*fn)(const char *tok, size_t n, int eos,
                                  void *arg),
                       void *arg) {
  char buf[TOK_MAX];
  char prev[TOK_MAX];
  size_t plen = 0;
  size_t i = 0;
  while (i < len) {
    unsigned char c = (unsigned char)s[i];
    if (isspace(c) || c < 32 || c == 127) {
      plen = 0;
      i++;
      continue;
    }
    if (word_byte(c)) {
      size_t j = i, n = 0;
      while (j < len && word_byte((unsigned char)s[j])) {
        if (n < TOK_MAX)
          buf[n++] = (char)tolower((unsigned char)s[j]);
        j++;
      }
      fn(buf, n, 0, arg);
      memcpy(prev, buf, n);
      plen = n;
      i = j;
      continue;
    }
    int eos = (c == '.' || c == '?' || c == '!') &&
              ends_sentence(s, len, i, prev, plen);
    buf[0] = (char)c;
    fn(buf, 1, eos, arg);
    plen = 0;
    i++;
  }
}
