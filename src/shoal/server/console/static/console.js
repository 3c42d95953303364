// Shoal's console: each page reads the same JSON API the commands read (with the login's
// HttpOnly cookie and the X-Shoal-Console header), renders it as HTML, and renders again on
// every server-sent "change" event. No framework and no build step (docs/CONSOLE.md).
"use strict";

const PAGE = document.body.dataset.page;
const JOB = document.body.dataset.job;
const main = document.getElementById("main");
const controls = document.getElementById("controls");
let me = null;  // GET /shoal/v1/whoami

const esc = (s) => String(s ?? "").replace(/[&<>"']/g,
  (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));

async function api(path, options = {}) {
  const r = await fetch(path, {
    ...options, credentials: "same-origin",
    headers: {"X-Shoal-Console": "1", "Content-Type": "application/json", ...(options.headers || {})},
  });
  if (r.status === 401) {
    location.href = "/console/login?next=" + encodeURIComponent(location.pathname + location.search);
    throw new Error("logged out");
  }
  const body = r.headers.get("content-type")?.includes("json") ? await r.json() : await r.text();
  if (!r.ok) {
    const e = new Error((body && body.detail) || r.statusText);
    e.status = r.status;
    throw e;
  }
  return body;
}

// ------------------------------------------------------------------ formatting

const time = (t) => t == null ? "" : new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19);
function duration(s) {
  if (s == null) return "";
  s = Math.max(0, Math.round(s));
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
  const hms = `${String(h).padStart(2, "0")}:${String(m).padStart(2, "0")}:${String(s % 60).padStart(2, "0")}`;
  return d ? `${d}-${hms}` : hms;
}
const jobId = (j) => j.array_job_id != null ? `${j.array_job_id}_${j.array_task_id}` : String(j.job_id);
const stateBadge = (s) => `<span class="state st-${esc(String(s).toLowerCase())}">${esc(s)}</span>`;
const empty = (what) => `<p class="empty">${esc(what)}</p>`;
function table(headers, rows, cls = "") {
  return `<div class="scroll"><table class="${cls}"><thead><tr>${headers.map((h) => `<th>${esc(h)}</th>`).join("")}</tr></thead>` +
    `<tbody>${rows.join("")}</tbody></table></div>`;
}
const mayChangeJob = (j) => me && (me.role === "admin" || me.role === "operator" || (me.role === "user" && me.user === j.user));
const isOperator = () => me && (me.role === "admin" || me.role === "operator");

function flash(message, bad = false) {
  const f = document.getElementById("flash");
  f.textContent = message;
  f.className = bad ? "show bad" : "show";
  clearTimeout(flash.timer);
  flash.timer = setTimeout(() => { f.className = ""; }, 4000);
}

// ------------------------------------------------------------------ charts (inline SVG, no library)

const PALETTE = ["#2f6fd6", "#e07b24", "#14a37f", "#c8434b", "#7e57c2", "#8d6e00", "#00838f", "#d81b60"];
const colour = (i) => PALETTE[i % PALETTE.length];
const clock = (t) => new Date(t * 1000).toISOString().slice(11, 19);
const day = (t) => new Date(t * 1000).toISOString().slice(5, 16).replace("T", " ");
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v)), m = v / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}
const fmt = (v) => String(v >= 100 ? Math.round(v) : Number(v >= 10 ? v.toFixed(1) : v.toPrecision(2)));
const chartLegend = (names) => `<div class="legend">${names.map((n, i) => `<span><i class="swatch" style="background:${colour(i)}"></i>${esc(n)}</span>`).join("")}</div>`;

// The frame both charts share: y grid lines with labels, the plot area, x labels under it.
const W = 640, H = 190, L = 46, R = 10, T = 10, B = 24;
function frame(yMax, unit, xLabels, body, title) {
  const grid = [0, 0.25, 0.5, 0.75, 1].map((f) => {
    const y = T + (H - T - B) * (1 - f);
    return `<line x1="${L}" x2="${W - R}" y1="${y}" y2="${y}" class="gridline"/><text x="${L - 6}" y="${y + 4}" text-anchor="end">${fmt(yMax * f)}</text>`;
  }).join("");
  // The labels at the edges are anchored inwards, so none is cut by the frame.
  const anchor = (x) => x <= L + 40 ? "start" : x >= W - R - 40 ? "end" : "middle";
  const xs = xLabels.map(([x, label]) => `<text x="${x}" y="${H - 6}" text-anchor="${anchor(x)}">${esc(label)}</text>`).join("");
  return `<figure class="chart"><figcaption>${esc(title)} <span class="muted">(${esc(unit)})</span></figcaption>` +
    `<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="${esc(title)}">${grid}${body}${xs}</svg></figure>`;
}

// Lines over time: series [{name, points: [[t, v], ...]}].
function lineChart(title, unit, series, yMax) {
  const all = series.flatMap((s) => s.points);
  if (!all.length) return "";
  let t0 = Math.min(...all.map((p) => p[0])), t1 = Math.max(...all.map((p) => p[0]));
  if (t1 <= t0) t1 = t0 + 1;
  const top = yMax ?? niceMax(Math.max(...all.map((p) => p[1])));
  const x = (t) => L + (W - L - R) * (t - t0) / (t1 - t0), y = (v) => T + (H - T - B) * (1 - Math.min(v, top) / top);
  const lines = series.map((s, i) => s.points.length === 1
    ? `<circle cx="${x(s.points[0][0])}" cy="${y(s.points[0][1])}" r="3" fill="${colour(i)}"/>`
    : `<polyline fill="none" stroke="${colour(i)}" stroke-width="2" points="${s.points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ")}"/>`).join("");
  const xLabels = [0, 0.5, 1].map((f) => [L + (W - L - R) * f, clock(t0 + (t1 - t0) * f)]);
  return frame(top, unit, xLabels, lines, title);
}

// Stacked bars per time bucket: over {bucket_s, start, buckets}, stacks {name: [value per bucket]}.
function barChart(title, unit, over, stacks) {
  const names = Object.keys(stacks);
  if (!names.length || !over.buckets) return "";
  const totals = Array.from({length: over.buckets}, (_, i) => names.reduce((a, n) => a + stacks[n][i], 0));
  const top = niceMax(Math.max(...totals));
  const slot = (W - L - R) / over.buckets, bw = Math.max(1, slot * 0.8);
  const y = (v) => (H - T - B) * v / top;
  let bars = "";
  for (let i = 0; i < over.buckets; i++) {
    let base = H - B;
    names.forEach((n, k) => {
      const h = y(stacks[n][i]);
      if (h > 0) bars += `<rect x="${(L + i * slot + (slot - bw) / 2).toFixed(1)}" y="${(base - h).toFixed(1)}" width="${bw.toFixed(1)}" height="${h.toFixed(1)}" fill="${colour(k)}"><title>${esc(n)}: ${fmt(stacks[n][i])} ${esc(unit)} from ${esc(day(over.start + i * over.bucket_s))}</title></rect>`;
      base -= h;
    });
  }
  const label = over.bucket_s >= 86400 ? day : clock;
  const xLabels = [0, Math.floor((over.buckets - 1) / 2), over.buckets - 1].filter((v, i, a) => a.indexOf(v) === i)
    .map((i) => [L + (i + 0.5) * slot, label(over.start + i * over.bucket_s)]);
  return frame(top, unit, xLabels, bars, title) + chartLegend(names);
}

function bucketWords(s) {
  const [n, unit] = s % 604800 === 0 ? [s / 604800, "week"] : s % 86400 === 0 ? [s / 86400, "day"]
    : s % 3600 === 0 ? [s / 3600, "hour"] : [s / 60, "minute"];
  return n === 1 ? unit : `${n} ${unit}s`;
}

// A job's GPU use: its summary (sacct's TRESUsageIn* figures) and each node's lines.
function gpuUse(u) {
  if (!u || !u.summary) return empty("No GPU samples yet: the agents report with each heartbeat.");
  const g = u.summary, gib = (b) => b >= 2 ** 30 ? (b / 2 ** 30).toFixed(2) + " GiB" : Math.round(b / 2 ** 20) + " MiB";
  const fields = [["GPUs sampled", g.gpus], ["Utilisation, average", `${g.gpuutil.ave}%`],
    ["Utilisation, peak", `${g.gpuutil.max}% (${g.gpuutil.max_node})`], ["Memory, peak", `${gib(g.gpumem_bytes.max)} (${g.gpumem_bytes.max_node})`],
    ["Energy", `${(g.energy_j.tot / 3.6e6).toFixed(4)} kWh (${Math.round(g.energy_j.tot)} J)`],
    ["Busy GPU-hours", (g.busy_gpu_s / 3600).toFixed(3)], ["Sampled", `${time(g.first_time)} to ${clock(g.last_time)}`]];
  const nodes = u.nodes.map((n) => n.node);
  const utilSeries = u.nodes.map((n) => ({name: n.node, points: n.points.map((p) => [p[0], p[1]])}));
  const peak = Math.max(0, ...utilSeries.flatMap((s) => s.points.map((p) => p[1])));
  const util = lineChart("GPU utilisation, mean of the node's GPUs", "%", utilSeries, Math.min(100, niceMax(peak)));
  const mem = lineChart("GPU memory used, sum of the node's GPUs", "MiB", u.nodes.map((n) => ({name: n.node, points: n.points.map((p) => [p[0], p[2]])})));
  return `<div class="cols gpu-use"><section><dl class="fields" id="gpu-summary">${fields.map(([k, v]) => `<dt>${esc(k)}</dt><dd>${esc(v)}</dd>`).join("")}</dl></section>` +
    `<section id="gpu-plots">${util}${mem}${chartLegend(nodes)}</section></div>`;
}

// ------------------------------------------------------------------ pages

const HOLDERS = ["training", "serving", "completing", "idle", "drained", "down"];

async function overview() {
  const data = await api("/console/api/overview");
  if (!data.nodes.length) return empty("No nodes have registered yet: start an agent (shoal agent) or shoal up.");
  const legend = `<div class="legend">${HOLDERS.map((h) => `<span><i class="gpu h-${h}"></i>${h}</span>`).join("")}</div>`;
  const totals = table(["partition", "nodes", "GPUs", ...HOLDERS],
    data.partitions.map((t) => `<tr><td>${esc(t.partition)}</td><td>${t.nodes}</td><td>${t.gpus}</td>` +
      HOLDERS.map((h) => `<td class="num">${t[h] || ""}</td>`).join("") + "</tr>"), "totals");
  const nodes = data.nodes.map((n) => {
    const cells = n.gpus.map((g) => {
      const who = g.job ? (g.job.kind === "pod" ? `pod ${g.job.namespace}/${g.job.name}` : `job ${g.job.job_id} ${g.job.name} (${g.job.user})`) : g.holder;
      const util = g.utilisation == null ? "" : `${Math.round(g.utilisation)}%`;
      const title = `${n.name} GPU ${g.index}: ${g.model}\n${who}${util ? "\nutilisation " + util : ""}${g.healthy ? "" : "\nunhealthy"}`;
      const link = g.job && g.job.kind !== "pod" ? ` data-href="/console/jobs/${g.job.job_id}"` : "";
      return `<span class="gpu h-${g.holder}${g.healthy ? "" : " unhealthy"}" data-holder="${g.holder}" title="${esc(title)}"${link}>` +
        `<b>${g.index}</b><small>${util}</small>${util ? `<em style="height:${Math.round(g.utilisation)}%"></em>` : ""}</span>`;
    }).join("");
    const model = [...new Set(n.gpus.map((g) => g.model))].join(", ");
    return `<div class="node" data-node="${esc(n.name)}"><div class="node-head"><b>${esc(n.name)}</b>${stateBadge(n.state)}</div>` +
      `<div class="gpus">${cells || '<span class="muted">no GPUs</span>'}</div>` +
      `<div class="model" title="${esc(model)}">${esc(model) || "&nbsp;"}</div>` +
      (n.reason ? `<div class="reason" title="${esc(n.reason)}">${esc(n.reason)}</div>` : "") + "</div>";
  }).join("");
  return `<h2>GPUs by partition</h2>${totals}<h2>Nodes</h2>${legend}<div class="grid">${nodes}</div>`;
}

function queueControls() {
  const q = new URLSearchParams(location.search);
  controls.innerHTML = `<form class="filters" id="filters">
    <label>User <input name="user" value="${esc(q.get("user"))}" placeholder="any"></label>
    <label>Partition <input name="partition" value="${esc(q.get("partition"))}" placeholder="any"></label>
    <label>State <select name="state">${["", "PENDING", "RUNNING"].map((s) =>
      `<option value="${s}"${q.get("state") === s ? " selected" : ""}>${s || "any"}</option>`).join("")}</select></label>
  </form>`;
  const filters = document.getElementById("filters");
  const apply = () => {
    const form = new FormData(filters);
    const p = new URLSearchParams();
    for (const [k, v] of form) if (v) p.set(k, v);
    history.replaceState(null, "", location.pathname + (p.toString() ? "?" + p : ""));
    refresh();
  };
  filters.addEventListener("input", apply);
  filters.addEventListener("change", apply);
  filters.addEventListener("submit", (e) => { e.preventDefault(); apply(); });
}

async function queue() {
  const q = new URLSearchParams(location.search);
  const p = new URLSearchParams();
  for (const k of ["user", "partition", "state"]) if (q.get(k)) p.set(k, q.get(k));
  const {jobs} = await api("/shoal/v1/jobs?" + p);
  const now = Date.now() / 1000;
  // An array's pending tasks are one row, as squeue shows them (12_[4-11%4]).
  const shown = new Set();
  const listed = jobs.filter((j) => {
    if (j.state !== "PENDING" || !j.array_spec) return true;
    if (shown.has(j.array_job_id)) return false;
    shown.add(j.array_job_id);
    return true;
  });
  const rows = listed.map((j) => {
    const state = j.completing ? "COMPLETING" : j.state;
    const reason = j.state === "PENDING" ? j.reason : j.nodelist;
    const id = j.state === "PENDING" && j.array_spec ? `${j.array_job_id}_[${j.array_spec}]` : jobId(j);
    return `<tr data-job="${j.job_id}" data-state="${esc(state)}"><td><a href="/console/jobs/${j.job_id}">${esc(id)}</a></td>` +
      `<td>${esc(j.name)}</td><td>${esc(j.user)}</td><td>${esc(j.partition)}</td><td>${stateBadge(state)}</td>` +
      `<td class="num">${j.nodes}</td><td class="num">${j.gpus_per_node ? j.gpus_per_node * j.nodes : ""}</td>` +
      `<td>${j.start_time ? duration(now - j.start_time) : ""}</td><td>${esc(j.time_limit_s ? duration(j.time_limit_s) : "UNLIMITED")}</td>` +
      `<td>${j.state === "PENDING" ? esc(j.expected_start ? time(j.expected_start) : "N/A") : esc(time(j.start_time))}</td>` +
      `<td class="reason-col">${esc(reason)}</td></tr>`;
  });
  const pending = jobs.filter((j) => j.state === "PENDING").length;
  const summary = `<p class="summary">${jobs.length} job(s): ${jobs.length - pending} running or completing, ${pending} pending</p>`;
  return summary + (rows.length ? table(["JOBID", "NAME", "USER", "PARTITION", "STATE", "NODES", "GPUS", "TIME",
    "TIME_LIMIT", "START_TIME", "NODELIST(REASON)"], rows, "queue") : empty("No jobs match: the queue is empty."));
}

function stateHistory(j) {
  const out = [[j.submit_time, "PENDING", "submitted"]];
  if (j.eligible_time && j.eligible_time > j.submit_time) out.push([j.eligible_time, "PENDING", "eligible"]);
  if (j.state === "PENDING" && j.reason && j.reason !== "None") out.push([null, "PENDING", "reason: " + j.reason]);
  if (j.restart_count) out.push([null, "REQUEUED", `requeued ${j.restart_count} time(s)`]);
  if (j.start_time != null) out.push([j.start_time, "RUNNING", "on " + (j.nodelist || "?")]);
  if (j.end_time != null) out.push([j.end_time, j.state, j.exit_code != null ? `exit code ${j.exit_code}:${j.signal || 0}` : ""]);
  return out;
}

async function jobPage() {
  let j;
  try {
    j = await api(`/shoal/v1/jobs/${JOB}`);
  } catch (e) {
    if (e.status === 404) return empty(`Job ${JOB} does not exist, or is not yours to see.`);
    throw e;
  }
  let script = null, output = null, gpu = null;
  const gpuJob = (j.gpus_per_node || j.gpu_usage) && j.start_time != null;  // plotted once it has started
  if (gpuJob) {
    try {
      gpu = await api(`/shoal/v1/jobs/${JOB}/gpu-usage`);
    } catch (e) { /* shown as no samples */ }
  }
  try {
    script = await api(`/shoal/v1/jobs/${JOB}/script`);  // the bytes as submitted
  } catch (e) { /* not the owner: the page says so */ }
  if (j.start_time != null && !j.interactive && (script != null || isOperator())) {
    try {
      output = (await api(`/shoal/v1/jobs/${JOB}/output?size=16384`)).split("\n").slice(-200).join("\n");
    } catch (e) {
      output = {error: e.message};
    }
  }
  following = j.state === "RUNNING";
  const actions = [];
  if (mayChangeJob(j)) {
    if (j.state === "PENDING" || j.state === "RUNNING") actions.push(["cancel", "Cancel"]);
    if (j.state === "PENDING" && !j.held) actions.push(["hold", "Hold"]);
    if (j.state === "PENDING" && j.held) actions.push(["release", "Release"]);
  }
  const fields = [["User", j.user], ["Account", j.account || ""], ["Partition", j.partition], ["QOS", j.qos || "normal"],
    ["State", j.completing ? "COMPLETING" : j.state], ["Reason", j.reason], ["Nodes", j.nodes], ["Tasks", j.ntasks],
    ["CPUs", j.cpus], ["GPUs per node", j.gpus_per_node + (j.gpu_type ? ` (${j.gpu_type})` : "")],
    ["Memory per node", j.mem_per_node_mb ? j.mem_per_node_mb + " MB" : "all"],
    ["Time limit", j.time_limit_s ? duration(j.time_limit_s) : "UNLIMITED"], ["Priority", j.priority],
    ["Dependency", j.dependency || ""], ["Expected start", j.expected_start ? time(j.expected_start) : ""],
    ["Work dir", j.workdir], ["Output", j.stdout || ""], ["Exit code", j.exit_code != null ? `${j.exit_code}:${j.signal || 0}` : ""]];
  const alloc = (j.allocation?.nodes || []).map((n) => `<tr><td>${esc(n.name)}</td><td class="num">${n.cpus}</td>` +
    `<td class="num">${n.memory_mb}</td><td>${n.gpus.length ? esc(n.gpus.join(",")) : ""}</td></tr>`);
  const directives = script ? script.split("\n").filter((l) => /^#SBATCH\b/.test(l)) : null;
  const steps = (j.steps || []).map((s) => `<tr><td>${esc(j.job_id + "." + s.step_id)}</td><td>${esc(s.name)}</td>` +
    `<td>${stateBadge(s.state)}</td><td>${esc(s.nodelist)}</td><td>${esc(time(s.start_time))}</td><td>${esc(time(s.end_time))}</td></tr>`);
  return `<h2>Job ${esc(jobId(j))}: ${esc(j.name)} ${stateBadge(j.completing ? "COMPLETING" : j.state)}</h2>
    <div class="actions">${actions.map(([a, label]) => `<button data-action="${a}" id="job-${a}">${label}</button>`).join("")}</div>
    <div class="cols"><section><h3>Details</h3><dl class="fields">${fields.map(([k, v]) => `<dt>${esc(k)}</dt><dd>${esc(v)}</dd>`).join("")}</dl></section>
    <section><h3>State history</h3>${table(["time", "state", ""], stateHistory(j).map(([t, s, n]) => `<tr><td>${esc(time(t))}</td><td>${stateBadge(s)}</td><td>${esc(n)}</td></tr>`), "history")}
    <h3>Nodes and GPUs</h3>${alloc.length ? table(["node", "CPUs", "memory MB", "GPU indices"], alloc) : empty("No allocation yet.")}
    ${steps.length ? "<h3>Steps</h3>" + table(["step", "name", "state", "nodes", "start", "end"], steps) : ""}</section></div>
    ${gpuJob ? `<h3>GPU use</h3>${gpuUse(gpu)}` : ""}
    <h3>Output <span class="muted">${esc(j.stdout || "")}${following ? " (following)" : ""}</span></h3>${output == null ? empty(j.start_time == null ? "No output before the job starts." : "Shown only to the job's owner and operators.") : output.error ? `<p class="error">${esc(output.error)}</p>` : `<pre class="output" id="output">${esc(output) || " "}</pre>`}
    <h3>Directives</h3>${directives == null ? empty("Shown only to the job's owner and operators.") : directives.length ? `<pre class="directives">${esc(directives.join("\n"))}</pre>` : empty("No #SBATCH lines.")}
    <h3>Script</h3>${script == null ? empty(j.command && j.command !== "(script)" ? "Submitted as: " + j.command + " (the script is shown only to its owner and operators)" : "Shown only to the job's owner and operators.") : `<pre class="script" id="script">${esc(script)}</pre>`}`;
}

main.addEventListener("click", async (e) => {
  const button = e.target.closest("button[data-action]");
  if (button && PAGE === "job") {
    const action = button.dataset.action;
    try {
      await api(`/shoal/v1/jobs/${JOB}/${action}`, {method: "POST", body: "{}"});
      flash(`Job ${JOB}: ${action} done`);
    } catch (err) {
      flash(err.message, true);
    }
    refresh();
  }
  const node = e.target.closest("button[data-node-action]");
  if (node) {
    const name = node.dataset.name;
    const body = node.dataset.nodeAction === "drain"
      ? {state: "DRAIN", reason: main.querySelector(`input[data-reason="${CSS.escape(name)}"]`).value.trim()}
      : {state: "RESUME"};
    if (body.state === "DRAIN" && !body.reason) return flash("A drain needs a reason.", true);
    try {
      await api(`/shoal/v1/nodes/${encodeURIComponent(name)}`, {method: "PATCH", body: JSON.stringify(body)});
      flash(`${name}: ${body.state === "DRAIN" ? "draining" : "resumed"}`);
    } catch (err) {
      flash(err.message, true);
    }
    refresh();
  }
  const cell = e.target.closest("[data-href]");
  if (cell) location.href = cell.dataset.href;
});

function rollout(d) {
  const want = d.spec?.replicas ?? 1, st = d.status || {};
  if ((st.observedGeneration ?? 0) < (d.metadata.generation ?? 0)) return "waiting for the controller";
  if ((st.updatedReplicas ?? 0) < want) return `rolling out: ${st.updatedReplicas ?? 0} of ${want} updated`;
  if ((st.replicas ?? 0) > (st.updatedReplicas ?? 0)) return `rolling out: ${st.replicas - st.updatedReplicas} old replica(s) ending`;
  if ((st.availableReplicas ?? 0) < want) return `rolling out: ${st.availableReplicas ?? 0} of ${want} available`;
  return "complete";
}

async function serving() {
  const [deps, pods, hpas, load] = await Promise.all([
    api("/shoal/v1/kube/objects/deployments?namespace=all"), api("/shoal/v1/kube/objects/pods?namespace=all"),
    api("/shoal/v1/kube/objects/horizontalpodautoscalers?namespace=all"), api("/console/api/pod-load")]);
  if (!deps.items.length && !pods.items.length) return empty("No Deployments or pods: apply one with shoal apply -f.");
  const hpaOf = {};
  for (const h of hpas.items) hpaOf[`${h.metadata.namespace}/${h.spec?.scaleTargetRef?.name}`] = h;
  const drows = deps.items.map((d) => {
    const st = d.status || {}, key = `${d.metadata.namespace}/${d.metadata.name}`, h = hpaOf[key];
    const rev = d.metadata.annotations?.["deployment.kubernetes.io/revision"] || "";
    const state = rollout(d);
    return `<tr data-deployment="${esc(key)}"><td>${esc(d.metadata.namespace)}</td><td>${esc(d.metadata.name)}</td>` +
      `<td class="num">${st.readyReplicas ?? 0}/${d.spec?.replicas ?? 1}</td><td class="num">${st.updatedReplicas ?? 0}</td>` +
      `<td class="num">${st.availableReplicas ?? 0}</td><td class="num">${esc(rev)}</td>` +
      `<td><span class="${state === "complete" ? "ok" : "warn"}">${esc(state)}</span></td>` +
      `<td>${h ? esc(`${h.spec.minReplicas ?? 1}-${h.spec.maxReplicas} (now ${h.status?.currentReplicas ?? "?"}, want ${h.status?.desiredReplicas ?? "?"})`) : ""}</td></tr>`;
  });
  const prows = pods.items.map((p) => {
    const key = `${p.metadata.namespace}/${p.metadata.name}`, l = load.pods[key];
    const cs = p.status?.containerStatuses || [];
    const ready = cs.filter((c) => c.ready).length;
    const restarts = cs.reduce((n, c) => n + (c.restartCount || 0), 0);
    return `<tr data-pod="${esc(key)}"><td>${esc(p.metadata.namespace)}</td><td>${esc(p.metadata.name)}</td><td>${ready}/${cs.length || (p.spec?.containers || []).length}</td>` +
      `<td>${stateBadge(p.status?.phase || "Pending")}</td><td class="num">${restarts}</td><td>${esc(p.spec?.nodeName || "")}</td>` +
      `<td class="num">${l ? l.rps.toFixed(1) : ""}</td><td class="num">${l ? l.inflight.toFixed(0) : ""}</td></tr>`;
  });
  return `<h2>Deployments</h2>${drows.length ? table(["namespace", "name", "ready", "up-to-date", "available", "revision", "rollout", "autoscaler"], drows) : empty("No Deployments.")}
    <h2>Pods</h2>${table(["namespace", "name", "ready", "status", "restarts", "node", "requests/s", "in flight"], prows)}
    <p class="muted">Request rates and in-flight requests are the gateway's last report (as the autoscaler reads them); empty when no gateway has reported in the last 10 s.</p>`;
}

async function accounting() {
  const [shares, usage] = await Promise.all([api("/shoal/v1/shares"), api("/console/api/usage")]);
  const max = Math.max(1e-9, ...usage.accounts.map((a) => a.gpu_hours));
  const bar = (h) => `<span class="bar"><i style="width:${(100 * h / max).toFixed(1)}%"></i></span>`;
  const busy = (x) => x.gpu_hours > 0 ? `${Math.round(100 * x.busy_gpu_hours / x.gpu_hours)}%` : "";
  const accounts = usage.accounts.map((a) => `<tr data-account="${esc(a.account)}"><td>${esc(a.account)}</td><td class="num">${a.gpu_hours.toFixed(2)}</td><td class="num">${a.busy_gpu_hours.toFixed(2)}</td><td class="num">${busy(a)}</td><td>${bar(a.gpu_hours)}</td></tr>`);
  const users = usage.users.map((u) => `<tr data-user="${esc(u.user)}"><td>${esc(u.account)}</td><td>${esc(u.user)}</td><td class="num">${u.gpu_hours.toFixed(2)}</td><td class="num">${u.busy_gpu_hours.toFixed(2)}</td><td class="num">${busy(u)}</td><td>${bar(u.gpu_hours)}</td></tr>`);
  const over = usage.over_time, per = bucketWords(over.bucket_s);
  const charts = over.buckets ? `<h2>GPU-hours over time</h2><div class="cols" id="usage-charts"><section>${barChart(`GPU-hours by account, per ${per}`, "GPU-hours", over, over.accounts)}</section>` +
    `<section>${barChart(`GPU-hours by user, per ${per}`, "GPU-hours", over, over.users)}</section></div>` : "";
  const fs = (shares.shares || []).map((r) => `<tr${r.user === shares.user ? ' class="mine"' : ""}><td>${"&nbsp;".repeat(2 * r.depth)}${esc(r.account)}</td><td>${esc(r.user || "")}</td>` +
    `<td class="num">${r.raw_shares ?? ""}</td><td class="num">${r.norm_shares?.toFixed(6) ?? ""}</td><td class="num">${Math.round(r.raw_usage ?? 0)}</td>` +
    `<td class="num">${r.effective_usage?.toFixed(6) ?? ""}</td><td class="num">${r.fairshare != null ? r.fairshare.toFixed(6) : ""}</td></tr>`);
  return `${charts}<div class="cols"><section><h2>GPU-hours by account</h2>${accounts.length ? table(["account", "GPU-hours", "busy", "busy %", ""], accounts) : empty("No job has used a GPU yet.")}</section>
    <section><h2>GPU-hours by user</h2>${users.length ? table(["account", "user", "GPU-hours", "busy", "busy %", ""], users) : empty("No job has used a GPU yet.")}</section></div>
    <h2>Fair share (sshare)</h2>${fs.length ? table(["Account", "User", "RawShares", "NormShares", "RawUsage", "EffectvUsage", "FairShare"], fs, "shares") : empty("No accounts are configured.")}
    <p class="muted">GPU-hours: GPUs held, every job that started, over its run so far; busy: those hours weighted by the GPUs' utilisation as the agents sampled it${me && (me.role === "user") ? " (yours alone when the cluster keeps jobs private)" : ""}. Usage in the fair-share table decays with a half-life of ${duration(shares.weights?.decay_half_life_s)}.</p>`;
}

async function nodes() {
  const {nodes} = await api("/shoal/v1/nodes");
  if (!nodes.length) return empty("No nodes have registered yet.");
  const op = isOperator();
  const rows = nodes.map((n) => {
    // GPU feature discovery's labels are many and alike on every node: folded away.
    const all = Object.entries(n.labels || {}), gfd = all.filter(([k]) => k.startsWith("nvidia.com/"));
    const tag = ([k, v]) => `<span class="tag">${esc(k)}=${esc(v)}</span>`;
    const labels = all.filter(([k]) => !k.startsWith("nvidia.com/")).map(tag).join(" ") +
      (gfd.length ? ` <details data-labels="${esc(n.name)}"><summary>${gfd.length} nvidia.com/ labels</summary>${gfd.map(tag).join(" ")}</details>` : "");
    const taints = (n.taints || []).map((t) => `<span class="tag taint">${esc(t.key)}${t.value ? "=" + esc(t.value) : ""}:${esc(t.effect)}</span>`).join(" ");
    const health = (n.gpu_health || []).length ? (n.gpu_health).map((h) => `<span class="warn">GPU ${h.index}: ${esc(h.kind)}</span>`).join(" ") : '<span class="ok">ok</span>';
    const beat = n.last_heartbeat ? `${Math.max(0, Math.round(Date.now() / 1000 - n.last_heartbeat))} s ago` : "never";
    const drained = n.state === "DRAIN" || n.state === "DOWN";
    const action = !op ? "" : drained
      ? `<button data-node-action="resume" data-name="${esc(n.name)}">Resume</button>`
      : `<input data-reason="${esc(n.name)}" placeholder="reason" aria-label="drain reason for ${esc(n.name)}"><button data-node-action="drain" data-name="${esc(n.name)}">Drain</button>`;
    return `<tr data-node="${esc(n.name)}"><td>${esc(n.name)}</td><td>${stateBadge(n.display_state)}</td><td>${esc(n.reason || "")}</td>` +
      `<td>${esc((n.partitions || []).join(","))}</td><td class="num">${n.cpus_alloc}/${n.cpus}</td><td class="num">${n.gpus_alloc}/${n.gpus.length}</td>` +
      `<td>${esc(n.gres)}</td><td>${health}</td><td>${beat}</td><td class="labels">${labels}</td><td>${taints}</td>` +
      (op ? `<td class="node-action">${action}</td>` : "") + "</tr>";
  });
  return table(["node", "state", "reason", "partitions", "CPUs", "GPUs", "GRES", "GPU health", "heartbeat", "labels", "taints", ...(op ? [""] : [])], rows, "nodes");
}

// A running job's output follows live: its page re-reads it this often (the output file is
// not a change the hub sees).
let following = false;
setInterval(() => { if (following && !document.hidden) refresh(); }, 2000);

const PAGES = {overview, queue, job: jobPage, serving, accounting, nodes};

// ------------------------------------------------------------------ refresh

let busy = false, again = false;

async function refresh() {
  if (busy) { again = true; return; }
  busy = true;
  try {
    do {
      again = false;
      // Keep what the user is typing (a drain reason) across a re-render.
      const typing = document.activeElement?.dataset?.reason;
      const kept = {};
      main.querySelectorAll("input[data-reason]").forEach((i) => { if (i.value) kept[i.dataset.reason] = i.value; });
      const open = [...main.querySelectorAll("details[open]")].map((d) => d.dataset.labels);
      const html = await PAGES[PAGE]();
      main.innerHTML = html;
      for (const [name, value] of Object.entries(kept)) {
        const i = main.querySelector(`input[data-reason="${CSS.escape(name)}"]`);
        if (i) i.value = value;
      }
      for (const name of open) main.querySelector(`details[data-labels="${CSS.escape(name)}"]`)?.setAttribute("open", "");
      const out = document.getElementById("output");
      if (out) out.scrollTop = out.scrollHeight;
      if (typing) main.querySelector(`input[data-reason="${CSS.escape(typing)}"]`)?.focus();
      document.body.dataset.rendered = String(Number(document.body.dataset.rendered || 0) + 1);
    } while (again);
  } catch (e) {
    if (e.message !== "logged out") main.innerHTML = `<p class="error">${esc(e.message)}</p>`;
  } finally {
    busy = false;
  }
}

async function start() {
  document.querySelector(`[data-nav="${PAGE === "job" ? "queue" : PAGE}"]`)?.classList.add("here");
  try {
    me = await api("/shoal/v1/whoami");
    document.getElementById("who").textContent = `${me.user} (${me.role})`;
  } catch (e) {
    return;
  }
  if (PAGE === "queue") queueControls();
  await refresh();
  const live = document.getElementById("live");
  const events = new EventSource("/console/events");
  events.addEventListener("change", () => { live.className = "live on"; refresh(); });
  events.onerror = () => { live.className = "live off"; };
}

start();
