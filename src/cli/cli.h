/* cli.h - the subcommands of the mixprec tool. */
#ifndef MP_CLI_H
#define MP_CLI_H

int mp_cli_train(int argc, char **argv);
int mp_cli_demo(int argc, char **argv);
int mp_cli_evaluate(int argc, char **argv);
int mp_cli_predict(int argc, char **argv);
int mp_cli_inspect(int argc, char **argv);

#endif
