// Shared by the node conformance tests: makes the tiny synthetic model in a private temp dir,
// starts pdserve-decode on port 0, runs pdserve-generate as the oracle, and guarantees that
// every child process is killed when the test ends, fails or runs past its deadline.
// Binaries come from the environment (set by tests/conformance/CMakeLists.txt):
//   PDSERVE_DECODE, PDSERVE_GENERATE, PDSERVE_MAKE_MODEL, PDSERVE_TINY_CONFIG.
import { execFile, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

// The official client, installed by scripts/setup.sh into tools/oracle/node_modules.
const oracleDir = fileURLToPath(new URL("../../tools/oracle/", import.meta.url));
export const openai = createRequire(join(oracleDir, "package.json"))("openai");

function requiredEnv(name) {
  const value = process.env[name];
  if (!value) throw new Error(`environment variable ${name} is not set (run the test via ctest)`);
  return value;
}

const children = new Set();
let tempDir = null;

function killChildren() {
  for (const child of children) child.kill("SIGKILL");
  children.clear();
  if (tempDir) rmSync(tempDir, { recursive: true, force: true });
  tempDir = null;
}
process.on("exit", killChildren);
for (const signal of ["SIGINT", "SIGTERM"]) {
  process.on(signal, () => {
    console.error(`received ${signal}: killing the servers`);
    process.exit(1);
  });
}

// Fails the whole test (children killed by the exit handler) if it is still running after
// `seconds`: below the CTest TIMEOUT, so that cleanup is ours and not CTest's.
export function setDeadline(seconds) {
  setTimeout(() => {
    console.error(`FAIL: the test did not finish within its ${seconds} s deadline`);
    process.exit(1);
  }, seconds * 1000).unref();
}

export function withTimeout(promise, seconds, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${seconds} s`)), seconds * 1000);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

function run(file, args, seconds) {
  return new Promise((resolve, reject) => {
    const child = execFile(file, args, { timeout: seconds * 1000, maxBuffer: 1 << 24 },
                           (error, stdout, stderr) => {
                             children.delete(child);
                             if (error) {
                               reject(new Error(`${file} ${args.join(" ")} failed: ${error.message}\n${stderr}`));
                             } else {
                               resolve(stdout);
                             }
                           });
    children.add(child);
  });
}

// The tiny checkpoint (tests/data/reference/configs/tiny.json, seed 7) with an untied lm_head:
// with tied embeddings the random model's greedy output just repeats the last prompt token,
// which would make text comparisons between prompts far less telling.
export async function makeModel() {
  tempDir = mkdtempSync(join(tmpdir(), "pdserve-conformance-"));
  const modelDir = join(tempDir, "model");
  await run(requiredEnv("PDSERVE_MAKE_MODEL"),
            ["--config", requiredEnv("PDSERVE_TINY_CONFIG"), "--out", modelDir, "--seed", "7", "--untie"],
            60);
  return modelDir;
}

// What `pdserve-generate --prompt P --temperature 0 --ignore-eos --max-new-tokens N` prints,
// without the newline it adds at the end. `prompt` is a string or an array of token ids.
export async function generateGreedy(modelDir, prompt, maxNewTokens, extraArgs = []) {
  const promptArgs = Array.isArray(prompt) ? ["--prompt-ids", prompt.join(",")] : ["--prompt", prompt];
  const stdout = await run(requiredEnv("PDSERVE_GENERATE"),
                           ["--model", modelDir, ...promptArgs, "--temperature", "0", "--ignore-eos",
                            "--max-new-tokens", String(maxNewTokens), "--threads", "1", ...extraArgs],
                           60);
  if (!stdout.endsWith("\n")) throw new Error(`pdserve-generate output does not end in a newline: ${stdout}`);
  return stdout.slice(0, -1);
}

// Starts pdserve-decode and waits for its "serving NAME on http://HOST:PORT" line.
// Returns {url, name, stop()}; stop() sends SIGTERM and resolves to the exit code.
export async function startServer(modelDir, extraArgs = [], startSeconds = 60) {
  const args = ["--model", modelDir, "--port", "0", "--threads", "1", "--kv-cache-memory-gib", "0.25",
                ...extraArgs];
  const child = spawn(requiredEnv("PDSERVE_DECODE"), args, { stdio: ["ignore", "pipe", "pipe"] });
  children.add(child);
  let stderr = "";
  child.stderr.on("data", (chunk) => {
    stderr += chunk;
  });
  const exited = new Promise((resolve) => child.on("exit", (code, signal) => {
    children.delete(child);
    resolve(code ?? signal);
  }));

  const serving = new Promise((resolve, reject) => {
    let stdout = "";
    child.stdout.on("data", (chunk) => {
      stdout += chunk;
      const match = /pdserve-decode: serving (\S+) on (http:\/\/\S+) \(device cpu\)/.exec(stdout);
      if (match) resolve({ name: match[1], url: match[2] });
    });
    exited.then((code) => reject(new Error(`pdserve-decode exited (${code}) before serving:\n${stderr}`)));
  });
  const { name, url } = await withTimeout(serving, startSeconds, "pdserve-decode start");
  return {
    url,
    name,
    stderr: () => stderr,
    async stop() {
      child.kill("SIGTERM");
      return withTimeout(exited, 15, "pdserve-decode shutdown");
    },
  };
}

// A client with retries off: a retried request would hide the status the server answered.
export function makeClient(server) {
  return new openai.OpenAI({ baseURL: `${server.url}/v1`, apiKey: "x", maxRetries: 0, timeout: 60_000 });
}

// Runs named async checks in order, reporting each; returns the number that failed.
export async function runChecks(checks) {
  let failed = 0;
  for (const [name, check] of checks) {
    const start = Date.now();
    try {
      await check();
      console.log(`ok   ${name} (${Date.now() - start} ms)`);
    } catch (error) {
      failed += 1;
      console.log(`FAIL ${name}: ${error.stack ?? error}`);
    }
  }
  return failed;
}
