// Stands in for pi's cli.js: RpcClient runs `node <cliPath> --mode rpc --provider P --model M ...`.
// The flags are ignored; the server is `FSM_PYTHON -m fsm rpc <FSM_RPC_ARGS>` (a JSON list),
// with this process's stdin, stdout and stderr, and the signals RpcClient.stop() sends passed on.
import { spawn } from "node:child_process";

const python = process.env.FSM_PYTHON || "python3";
const args = JSON.parse(process.env.FSM_RPC_ARGS || "[]");
const child = spawn(python, ["-m", "fsm", "rpc", ...args], { stdio: "inherit" });
for (const signal of ["SIGTERM", "SIGINT", "SIGHUP"]) {
  process.on(signal, () => child.kill(signal));
}
child.on("exit", (code, signal) => process.exit(code ?? (signal ? 128 : 1)));
child.on("error", (err) => {
  process.stderr.write(`shim: cannot start ${python} -m fsm rpc: ${err.message}\n`);
  process.exit(127);
});
