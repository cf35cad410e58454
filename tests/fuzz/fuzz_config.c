/* libFuzzer target: the configuration parser. A file that loads must print and load back
 * to the same values. Run with `make fuzz` (clang, ASan+UBSan). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    struct config *c = config_new();
    if (!c)
        return 0;
    if (config_load_buffer(c, "fuzz.ini", (const char *)data, size, err, sizeof(err)) == 0) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        struct config *d = config_new();
        if (!f || !d || config_print(c, f))
            abort();
        fclose(f);
        if (config_load_buffer(d, "printed.ini", text, len, err, sizeof(err)))
            abort();
        for (size_t i = 0; i < config_noptions; i++) {
            char a[512], b[512], key[128];
            snprintf(key, sizeof(key), "%s.%s", config_options[i].section, config_options[i].name);
            if (config_get(c, key, a, sizeof(a)) || config_get(d, key, b, sizeof(b)) ||
                strcmp(a, b) != 0)
                abort();
        }
        config_free(d);
        free(text);
    }
    config_free(c);
    return 0;
}
