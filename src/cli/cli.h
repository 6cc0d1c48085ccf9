/* cli.h - the subcommands of the mixprec tool. */
#ifndef MP_CLI_H
#define MP_CLI_H

#include "mixprec.h"

int mp_cli_train(int argc, char **argv);
int mp_cli_demo(int argc, char **argv);
int mp_cli_evaluate(int argc, char **argv);
int mp_cli_predict(int argc, char **argv);
int mp_cli_inspect(int argc, char **argv);
int mp_cli_generate(int argc, char **argv); /* generate_cmd.c */
int mp_cli_report(int argc, char **argv);   /* report_cmd.c */
/* The report of run directories dirs[0..nd) into out; prints where. 0, 1
 * when some file was missing or unreadable (the page says which), 2 when
 * nothing could be written. */
int mp_cli_report_write(const char *const *dirs, int nd, const char *out);
int mp_cli_tune(int argc, char **argv); /* tune_cmd.c */

/* Shared by the subcommands: a decimal integer in [lo, hi], all of s. */
bool mp_cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
/* A refused option: "mixprec CMD: FLAG VALUE: WHY" on stderr; returns 2. */
int mp_cli_bad_option(const char *cmd, const char *flag, const char *v, const char *why);
/* Load "fashion-mnist[:train|:test]" (from dir, or the default location) or
 * a CSV path; prints the error and returns the exit status (0 on success). */
int mp_cli_load_spec(const char *spec, const char *dir, bool default_train, mp_dataset **out);
/* The same, where "text:PATH" (or text:fortunes) is cut in windows of
 * `context` tokens (0: no sequence model, so text is refused). */
int mp_cli_load_spec_ex(const char *spec, const char *dir, bool default_train, int64_t context,
                        mp_dataset **out);
/* Models known by name (models.c): "resnet20". */
bool mp_cli_is_builtin_model(const char *name);
mp_status mp_cli_builtin_model(const char *name, const char *policy, uint64_t seed,
                               int64_t max_batch, mp_model **out);

#endif
