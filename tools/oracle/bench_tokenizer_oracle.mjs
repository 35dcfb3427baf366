// Encode throughput of the oracle tokenizers on the benchmark text, for comparison with
// pdserve-bench-tokenizer (docs/PERF.md, section "Tokenizer"). One thread, best of N passes.
//   build/bench/tokenizer/pdserve-bench-tokenizer --dump-dir /tmp/tokbench
//   node tools/oracle/bench_tokenizer_oracle.mjs /tmp/tokbench [repeats]
// With HF_TOKENIZERS_DIR pointing at an installed `tokenizers` npm package (Hugging Face's Rust
// tokenizers), that implementation is timed as well.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import { TokenizerLoader } from "@lenml/tokenizers";

const [dumpDir, repeatsArg] = process.argv.slice(2);
if (!dumpDir) {
  console.error("usage: node bench_tokenizer_oracle.mjs DUMP_DIR [REPEATS]");
  process.exit(2);
}
const repeats = Number(repeatsArg ?? 3);
const assetDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../configs/models/qwen3-tokenizer");
const readJson = (name) => JSON.parse(fs.readFileSync(path.join(assetDir, name), "utf8"));

let start = performance.now();
const lenml = TokenizerLoader.fromPreTrained({ tokenizerJSON: readJson("tokenizer.json"), tokenizerConfig: readJson("tokenizer_config.json") });
console.log(`lenml load: ${(performance.now() - start).toFixed(1)} ms`);
const encoders = [["lenml", (text) => lenml.encode(text, { add_special_tokens: false }).length]];
if (process.env.HF_TOKENIZERS_DIR) {
  const { Tokenizer } = createRequire(import.meta.url)(path.resolve(process.env.HF_TOKENIZERS_DIR));
  start = performance.now();
  const hf = Tokenizer.fromFile(path.join(assetDir, "tokenizer.json"));
  console.log(`hf-rust load: ${(performance.now() - start).toFixed(1)} ms`);
  encoders.push(["hf-rust", async (text) => (await hf.encode(text, null, { addSpecialTokens: false })).getIds().length]);
}

for (const name of ["english", "cjk", "code"]) {
  const documents = fs.readFileSync(path.join(dumpDir, `${name}.txt`), "utf8").split("\f").filter((d) => d.length > 0);
  const bytes = documents.reduce((sum, d) => sum + Buffer.byteLength(d, "utf8"), 0);
  for (const [label, encode] of encoders) {
    let bestWall = Infinity;
    let bestCpu = Infinity; // process CPU time (user + system), helper threads included
    let tokens = 0;
    for (let r = 0; r < repeats; ++r) {
      tokens = 0;
      const t0 = performance.now();
      const c0 = process.cpuUsage();
      for (const document of documents) tokens += await encode(document);
      const cpu = process.cpuUsage(c0);
      bestWall = Math.min(bestWall, (performance.now() - t0) / 1e3);
      bestCpu = Math.min(bestCpu, (cpu.user + cpu.system) / 1e6);
    }
    const mb = bytes / 1e6;
    console.log(`${label.padEnd(7)} encode ${name.padEnd(7)}: ${(mb / bestWall).toFixed(2)} MB/s wall, ${(mb / bestCpu).toFixed(2)} MB/s CPU (${bytes} bytes, ${tokens} tokens, best of ${repeats})`);
  }
}
