/* Text escaping shared by the profiler's writers: JSON strings (traces,
 * memory.json) and HTML/SVG text and attribute values (the pages). */
#include <stdio.h>

#include "prof/internal.h"

void nb_prof__json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; p && *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
    else fputc(*p < 0x20 ? ' ' : *p, f); /* a name's tab or newline as a space: one line per name in viewers */
  }
  fputc('"', f);
}

void nb_prof__xml_text(FILE *f, const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; p && *p; p++) switch (*p) {
    case '<': fputs("&lt;", f); break;
    case '>': fputs("&gt;", f); break;
    case '&': fputs("&amp;", f); break;
    case '"': fputs("&quot;", f); break;
    case '\'': fputs("&#39;", f); break;
    default: fputc(*p < 0x20 ? ' ' : *p, f); break;
    }
}
