/**
 * The live tasks page: one self-contained HTML document (no build step, no external assets) that polls
 * `/admin/api/overview` every second, or `/admin/api/tasks/<id>` (and its logs) on a task's detail. Text goes in
 * through `textContent` only, so nothing a tool or a client wrote can become markup. Operators act from it (find and
 * replay, cancel, pause and resume, resend a dead webhook: PROTOCOL.md §30.5) with same-origin JSON POSTs to the admin
 * API. Opened with a dashboard login (docs/OPERATIONS.md), the page carries its session's CSRF token, which every POST
 * sends back, and a Log out button; the session cookie itself is `HttpOnly`, out of the script's reach.
 */
import { RESUME_WAIT_PREFIX } from '../tasks/catalog.js';

const CSRF_SLOT = '<meta name="taskrelay-csrf" content="">';

/** The page, carrying the CSRF token of the session it is served to (none: bearer or loopback access). */
export function tasksPage(csrf: string | undefined): string {
  // The token is base64url: nothing in it needs escaping in an attribute.
  return csrf === undefined
    ? TASKS_PAGE
    : TASKS_PAGE.replace(CSRF_SLOT, `<meta name="taskrelay-csrf" content="${csrf}">`);
}

const TASKS_PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>taskrelay · tasks</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
${CSRF_SLOT}
<style>
  :root { --bg:#0f1419; --panel:#182028; --line:#263240; --text:#d8dee6; --dim:#8a97a6; --accent:#4aa3ff;
          --ok:#3fb950; --bad:#f85149; --warn:#d29922; --info:#a371f7; }
  * { box-sizing: border-box; }
  body { margin:0; font:14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; background:var(--bg); color:var(--text); }
  header { display:flex; gap:24px; align-items:center; padding:12px 24px; background:var(--panel); border-bottom:1px solid var(--line); }
  header h1 { font-size:18px; margin:0; }
  header nav a { color:var(--dim); text-decoration:none; margin-right:16px; }
  header nav a.on, header nav a:hover { color:var(--text); }
  #updated { margin-left:auto; color:var(--dim); font-size:12px; }
  main { padding:16px 24px; }
  .cards { display:flex; gap:12px; margin-bottom:16px; }
  .card { background:var(--panel); border:1px solid var(--line); border-radius:6px; padding:10px 16px; min-width:140px; }
  .card b { display:block; font-size:22px; }
  .card span { color:var(--dim); font-size:12px; }
  section { background:var(--panel); border:1px solid var(--line); border-radius:6px; margin-bottom:16px; }
  section h2 { font-size:14px; margin:0; padding:8px 12px; border-bottom:1px solid var(--line); color:var(--dim); text-transform:uppercase; letter-spacing:.05em; }
  table { width:100%; border-collapse:collapse; }
  th, td { text-align:left; padding:6px 12px; border-bottom:1px solid var(--line); vertical-align:middle; }
  th { color:var(--dim); font-weight:500; font-size:12px; }
  tr:last-child td { border-bottom:none; }
  td.mono, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size:12px; }
  a { color:var(--accent); }
  .badge { display:inline-block; padding:1px 8px; border-radius:10px; font-size:12px; border:1px solid currentColor; }
  .s-working { color:var(--accent); } .s-input_required { color:var(--info); } .s-completed { color:var(--ok); }
  .s-failed { color:var(--bad); } .s-cancelled { color:var(--warn); }
  .bar { width:160px; height:10px; background:var(--line); border-radius:5px; overflow:hidden; display:inline-block; vertical-align:middle; }
  .bar i { display:block; height:100%; background:var(--accent); }
  .bar.done i { background:var(--ok); }
  .pct { color:var(--dim); font-size:12px; margin-left:6px; }
  .pct.resume { color:var(--warn); margin-left:0; }
  .tools span { display:inline-block; background:var(--line); border-radius:4px; padding:0 6px; margin:1px 4px 1px 0; font-size:12px; }
  .empty { color:var(--dim); padding:10px 12px; }
  ol.timeline { list-style:none; margin:0; padding:8px 12px; }
  ol.timeline li { padding:4px 0 4px 16px; border-left:2px solid var(--line); position:relative; }
  ol.timeline li::before { content:""; position:absolute; left:-6px; top:9px; width:10px; height:10px; border-radius:50%; background:var(--accent); }
  dl { display:grid; grid-template-columns: 160px 1fr; margin:0; padding:8px 12px; gap:4px 12px; }
  dt { color:var(--dim); }
  pre { margin:0; padding:8px 12px; white-space:pre-wrap; word-break:break-all; }
  #error { color:var(--bad); padding:8px 24px; }
  button { background:var(--line); color:var(--text); border:1px solid var(--dim); border-radius:4px; padding:2px 10px; cursor:pointer; font:inherit; font-size:12px; }
  button:hover { border-color:var(--accent); }
  form.find { display:flex; flex-wrap:wrap; gap:8px; align-items:center; padding:8px 12px; }
  form.find input, form.find select { background:var(--bg); color:var(--text); border:1px solid var(--line); border-radius:4px; padding:3px 6px; font:inherit; font-size:12px; }
  #find-status { color:var(--dim); font-size:12px; padding:0 12px 8px; }
  #logout { margin:0; }
  td.fields { color:var(--dim); }
</style>
</head>
<body>
<header>
  <h1>taskrelay</h1>
  <nav><a href="../tasks" id="nav-tasks" class="on">Tasks</a><a href="../queues" id="nav-queues">Queues</a><a href="../../metrics" id="nav-metrics">Metrics</a></nav>
  <span id="updated"></span>
</header>
<div id="error" hidden></div>
<section id="find" hidden style="margin:16px 24px 0">
  <h2>Find tasks</h2>
  <form class="find" id="find-form">
    <select name="status" aria-label="status"><option value="">any status</option><option>failed</option><option>completed</option><option>cancelled</option><option>working</option><option>input_required</option></select>
    <input name="tool" placeholder="tool" aria-label="tool">
    <input name="tag" placeholder="tag" aria-label="tag">
    <input name="principal" placeholder="principal" aria-label="principal">
    <select name="since" aria-label="since"><option value="">any time</option><option value="3600000">last hour</option><option value="86400000">last day</option><option value="604800000" selected>last week</option></select>
    <button type="submit" id="find-search">Search</button>
    <button type="button" id="find-replay-all">Replay all matching</button>
  </form>
  <div id="find-status"></div>
  <div id="found"></div>
</section>
<main id="main"></main>
<script>
(() => {
  const base = location.pathname.replace(/\\/tasks(\\/.*)?$/, '');
  document.getElementById('nav-tasks').href = base + '/tasks';
  document.getElementById('nav-queues').href = base + '/queues';
  document.getElementById('nav-metrics').href = base.replace(/\\/admin$/, '') + '/metrics';
  const detailId = (location.pathname.match(/\\/tasks\\/([^/]+)$/) || [])[1];
  const main = document.getElementById('main');
  // A dashboard login's CSRF token (docs/OPERATIONS.md): sent with every action; its Log out ends the session.
  const csrf = document.querySelector('meta[name=taskrelay-csrf]').content;

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === 'text') node.textContent = String(v); else node.setAttribute(k, String(v));
    }
    for (const c of children) if (c !== undefined && c !== null) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return node;
  }
  function age(iso, now) {
    const s = Math.max(0, Math.round((now - Date.parse(iso)) / 1000));
    if (s < 60) return s + 's';
    if (s < 3600) return Math.floor(s / 60) + 'm ' + (s % 60) + 's';
    return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm';
  }
  function badge(status) { return el('span', { class: 'badge s-' + status, text: status }); }
  const RESUME_WAIT = ${JSON.stringify(RESUME_WAIT_PREFIX)};
  function progressBar(t) {
    if (t.progress === undefined || t.progress === null) {
      return el('span', { class: 'pct', text: t.attempt === undefined && t.status === 'working' ? 'queued' : '—' });
    }
    // A run handed back or lost with its worker (PROTOCOL.md §3.2, §5.7): its last values move no more, so no bar.
    if (t.status === 'working' && String(t.statusMessage || '').startsWith(RESUME_WAIT)) {
      const last = t.total ? t.progress + '/' + t.total : String(t.progress);
      return el('span', { class: 'pct resume', text: 'waiting to be resumed (last run ' + last + ')' });
    }
    const share = t.total ? Math.min(1, t.progress / t.total) : 0;
    const bar = el('span', { class: 'bar' + (t.status === 'completed' ? ' done' : '') }, el('i', { style: 'width:' + (share * 100).toFixed(1) + '%' }));
    const label = t.total ? t.progress + '/' + t.total + ' · ' + Math.floor(share * 100) + '%' : String(t.progress);
    return el('span', {}, bar, el('span', { class: 'pct', text: label }));
  }
  function table(headers, rows, empty) {
    if (rows.length === 0) return el('div', { class: 'empty', text: empty });
    return el('table', {}, el('thead', {}, el('tr', {}, ...headers.map((h) => el('th', { text: h })))),
      el('tbody', {}, ...rows.map((cells) => el('tr', {}, ...cells.map((c) => c instanceof Node && c.tagName === 'TD' ? c : el('td', {}, c))))));
  }
  const errorBox = document.getElementById('error');
  /** An operator's action: a same-origin POST (the gateway refuses other origins); its answer, or the error shown. */
  async function act(path, body) {
    const headers = { 'content-type': 'application/json' };
    if (csrf) headers['x-csrf-token'] = csrf;
    const res = await fetch(base + path, { method: 'POST', headers, body: JSON.stringify(body || {}) });
    const answer = await res.json().catch(() => ({}));
    if (!res.ok) {
      errorBox.hidden = false;
      errorBox.textContent = 'Refused: ' + (answer.error || res.statusText);
      throw new Error(answer.error || res.statusText);
    }
    return answer;
  }
  function button(label, onClick, attrs) {
    const b = el('button', Object.assign({ type: 'button', text: label }, attrs || {}));
    b.addEventListener('click', () => { b.disabled = true; onClick().catch(() => undefined).finally(() => { b.disabled = false; }); });
    return b;
  }
  const ENDED = ['completed', 'failed', 'cancelled'];
  function taskLink(id) { return el('a', { href: base + '/tasks/' + encodeURIComponent(id), text: id }); }
  /** A pool as people name it: its TASKRELAY_QUEUE, with the digest of its tools at their versions beside (§3.2). */
  function poolName(pool) {
    const m = /^(.*)\\.([0-9a-f]{12})$/.exec(pool || '');
    if (!m) return pool || '';
    return el('span', { title: 'pool ' + pool + ': this digest names its tools at their versions' }, m[1], el('span', { class: 'pct', text: 'pool ' + m[2] }));
  }
  /** A task's message: why it waits or how far it got, else the questions it waits to be answered. */
  function message(t) {
    if (t.statusMessage) return t.statusMessage;
    return t.questions && t.questions.length > 0 ? 'Asks: ' + t.questions.join(' · ') : '';
  }
  /** Tools as chips, each with the version its pool serves (the pool's digest is over these). */
  function toolChips(tools) {
    return el('span', { class: 'tools' }, ...tools.flatMap((t) => [el('span', { text: t.version ? t.name + '@' + t.version : t.name }), ' ']));
  }
  function card(value, label) { return el('div', { class: 'card' }, el('b', { text: value }), el('span', { text: label })); }

  function renderOverview(data) {
    const now = data.now;
    const waiting = data.queues.reduce((n, q) => n + (q.counts.waiting || 0) + (q.counts.prioritized || 0) + (q.counts.delayed || 0), 0);
    const active = data.queues.reduce((n, q) => n + (q.counts.active || 0), 0);
    const live = data.tasks.filter((t) => t.status === 'working' || t.status === 'input_required').length;
    main.replaceChildren(
      el('div', { class: 'cards' }, card(data.workers.length, 'live workers'), card(waiting, 'jobs queued'), card(active, 'jobs running'), card(live, 'live tasks')),
      el('section', { id: 'workers' }, el('h2', { text: 'Workers' }), table(['worker', 'TASKRELAY_QUEUE', 'tools', 'heartbeat'],
        data.workers.map((w) => [el('td', { class: 'mono', text: w.workerId }), poolName(w.queue),
          toolChips(w.tools), age(new Date(w.heartbeatAt).toISOString(), now) + ' ago']),
        'No live worker.')),
      el('section', { id: 'queues' }, el('h2', { text: 'Queues' }), table(['queue', 'waiting', 'active', 'delayed', 'failed', 'workers'],
        data.queues.map((q) => [el('a', { href: base + '/queues/queue/' + encodeURIComponent(q.queue), text: q.queue }),
          (q.counts.waiting || 0) + (q.counts.prioritized || 0), q.counts.active || 0, q.counts.delayed || 0, q.counts.failed || 0, q.workers]),
        'No queue.')),
      // A pool is named by a digest of its tools at their versions: the tools are shown beside it.
      el('section', { id: 'pools' }, el('h2', { text: 'Pools' }), table(['pool', 'workers', 'tools', 'last seen'],
        (data.pools || []).map((p) => [el('td', { class: 'mono', text: p.pool }), p.workers, toolChips(p.tools),
          age(new Date(p.lastSeenAt).toISOString(), now) + ' ago']),
        'No pool.')),
      el('section', { id: 'tasks' }, el('h2', { text: 'Tasks' }), table(['task', 'tool', 'status', 'progress', 'message', 'principal', 'age'],
        data.tasks.map((t) => [el('td', { class: 'mono' }, el('a', { href: base + '/tasks/' + encodeURIComponent(t.taskId), text: t.taskId })),
          t.tool, badge(t.status), progressBar(t), message(t), t.principal, age(t.createdAt, now)]),
        'No task is running. Finished tasks seen here stay listed until their ttl ends.')),
    );
    // Tools with a limit or a pause (PROTOCOL.md §3.3): their limits, running, waiting and paused state.
    const controlled = (data.tools || []).filter((t) => t.paused || t.concurrency !== undefined || t.rateLimit !== undefined);
    if (controlled.length > 0) {
      main.append(el('section', { id: 'tools' }, el('h2', { text: 'Limited and paused tools' }),
        table(['tool', 'state', 'concurrency', 'rate limit', 'running', 'waiting', ''],
          controlled.map((t) => [t.name, t.paused ? badge('paused') : 'running',
            t.concurrency === undefined ? '—' : 'at most ' + t.concurrency,
            t.rateLimit === undefined ? '—' : t.rateLimit.max + ' per ' + t.rateLimit.perMs + ' ms',
            t.active, t.waiting,
            button(t.paused ? 'Resume' : 'Pause', () => act('/api/tools/' + encodeURIComponent(t.name) + (t.paused ? '/resume' : '/pause')).then(poll))]),
          '')));
    }
    if (data.batches && data.batches.length > 0) {
      main.append(el('section', { id: 'batches' }, el('h2', { text: 'Batches' }),
        table(['task', 'children', 'total', 'queued', 'running', 'done', 'failed'],
          data.batches.map((b) => [el('td', { class: 'mono' }, el('a', { href: base + '/tasks/' + encodeURIComponent(b.taskId), text: b.taskId })),
            b.childTool, b.total, b.queued, b.running, b.done, b.failed]),
          '')));
    }
    if (data.webhooks) {
      const w = data.webhooks;
      main.append(el('section', { id: 'webhooks' }, el('h2', { text: 'Webhooks · ' + w.pending + ' pending · ' + w.dead + ' dead' }),
        table(['dead letter', 'task', 'status', 'url', 'tries', 'reason', 'age', ''],
          w.deadLetters.map((d) => [el('td', { class: 'mono', text: d.id }), el('td', { class: 'mono', text: d.taskId || '' }), d.status || '',
            el('td', { class: 'mono', text: d.url || '' }), d.attempts ?? '', d.reason, age(new Date(d.deadAt).toISOString(), now),
            button('Resend', () => act('/api/webhooks/dead/' + encodeURIComponent(d.id) + '/resend').then(poll))]),
          'No dead letter: every webhook event was delivered, is being retried, or was stopped by its receiver (410).')));
    }
    if (data.audit) {
      main.append(el('section', { id: 'audit' }, el('h2', { text: 'Operator actions' }),
        table(['when', 'who', 'action', 'on', 'outcome'],
          data.audit.map((a) => [age(a.at, now) + ' ago', a.by, a.action, el('td', { class: 'mono', text: a.target }), a.outcome]),
          'No operator action yet.')));
    }
  }

  /** A log line's own fields (what ctx.log was given beside its message), as key=value; strings bare, the rest JSON. */
  const LINE_KEYS = ['id', 'time', 'level', 'attempt', 'msg'];
  function logFields(line) {
    return Object.entries(line).filter(([k]) => !LINE_KEYS.includes(k))
      .map(([k, v]) => k + '=' + (typeof v === 'string' ? v : JSON.stringify(v))).join('  ');
  }

  function renderDetail(d) {
    const t = d.task;
    const rows = [['task', t.taskId], ['tool', t.tool + ' (queue ' + t.queue + ')'], ['status', badge(t.status)], ['progress', progressBar(t)],
      ['message', t.statusMessage || '—'], ...d.questions.map((q) => ['question', q]), ['principal', t.principal], ['mode', t.mode],
      // Runs are not attempts: a resume, a back-off or a batch parent's next window is a run; only a retry is an attempt.
      ['runs', t.attempt === undefined ? '—' : t.attempt + (d.batch ? ' — a batch parent runs again for each window of children it releases' : '')],
      ['attempt', d.job ? d.job.attempt + ' of ' + d.job.attempts : '—'],
      ['created', t.createdAt], ['last update', t.lastUpdatedAt], ['ttl', t.ttl + ' ms']];
    if (d.job) rows.push(['job', d.job.state + (d.job.workerName ? ', on ' + d.job.workerName : '')]);
    if (t.tags && t.tags.length > 0) rows.push(['tags', t.tags.join(', ')]);
    if (t.replayOf) rows.push(['replay of', taskLink(t.replayOf)]);
    if (t.replayedBy) rows.push(['replayed by', taskLink(t.replayedBy)]);
    const goTo = (answer) => { location.href = base + '/tasks/' + encodeURIComponent(answer.task.taskId); };
    const actions = ENDED.includes(t.status)
      ? [button('Replay', () => act('/api/tasks/' + encodeURIComponent(t.taskId) + '/replay').then(goTo), { id: 'replay' }),
         ' ', button('Replay, skipping succeeded steps', () => act('/api/tasks/' + encodeURIComponent(t.taskId) + '/replay', { redrive: true }).then(goTo), { id: 'redrive' })]
      : [button('Cancel', () => act('/api/tasks/' + encodeURIComponent(t.taskId) + '/cancel').then(poll), { id: 'cancel' })];
    const sections = [
      el('p', {}, el('a', { href: base + '/tasks', text: '← all tasks' }), '   ', ...actions),
      el('section', { id: 'task' }, el('h2', { text: 'Task' }), el('dl', {}, ...rows.flatMap(([k, v]) => [el('dt', { text: k }), el('dd', {}, v)]))),
      el('section', { id: 'timeline' }, el('h2', { text: 'Timeline' }), el('ol', { class: 'timeline' },
        ...d.timeline.map((e) => el('li', {}, el('span', { class: 'mono', text: e.at + '  ' }), el('b', { text: e.event }), e.detail ? ' — ' + e.detail : '')))),
    ];
    if (t.error) sections.push(el('section', {}, el('h2', { text: 'Error' }), el('pre', { class: 'mono', text: JSON.stringify(t.error, null, 2) })));
    if (t.result) sections.push(el('section', {}, el('h2', { text: 'Result' }), el('pre', { class: 'mono', text: JSON.stringify(t.result, null, 2) })));
    if (d.logs) {
      sections.push(el('section', { id: 'logs' }, el('h2', { text: 'Logs (ctx.log, newest 1,000 kept)' }),
        table(['time', 'level', 'run', 'message', 'fields'], d.logs.map((l) => [el('td', { class: 'mono', text: l.time }), l.level || '', l.attempt ?? '', l.msg || '',
          el('td', { class: 'mono fields', text: logFields(l) })]),
          'The tool logged nothing for this task.')));
    }
    main.replaceChildren(...sections);
  }

  // Find (PROTOCOL.md §30.2) and replay (§30.3): rendered once, not at each poll, so typing is never interrupted.
  const form = document.getElementById('find-form');
  const findStatus = document.getElementById('find-status');
  function filters() {
    const f = new FormData(form);
    const q = {};
    for (const k of ['status', 'tool', 'tag', 'principal']) if (f.get(k)) q[k] = String(f.get(k));
    if (f.get('since')) q.since = String(Date.now() - Number(f.get('since')));
    return q;
  }
  async function search() {
    const res = await fetch(base + '/api/tasks?' + new URLSearchParams(Object.assign({ limit: '100' }, filters())), { headers: { accept: 'application/json' } });
    const body = await res.json();
    if (!res.ok) { findStatus.textContent = 'Refused: ' + body.error; return; }
    findStatus.textContent = body.tasks.length + ' task(s)' + (body.nextCursor ? ' (more match: narrow the filters)' : '');
    document.getElementById('found').replaceChildren(table(['task', 'tool', 'status', 'principal', 'created', 'tags', 'error', ''],
      body.tasks.map((t) => [el('td', { class: 'mono' }, taskLink(t.taskId)), t.tool, badge(t.status), t.principal, t.createdAt,
        t.tags.join(', '), t.error ? t.error.code + ': ' + t.error.message : '',
        ENDED.includes(t.status) ? button('Replay', () => act('/api/tasks/' + encodeURIComponent(t.taskId) + '/replay').then(search)) : '']),
      'No task matches.'));
  }
  form.addEventListener('submit', (e) => { e.preventDefault(); search(); });
  document.getElementById('find-replay-all').addEventListener('click', async () => {
    const q = filters();
    const dry = await act('/api/tasks/replay', Object.assign({ dryRun: true }, q));
    if (dry.matched === 0) { findStatus.textContent = 'Nothing to replay (' + dry.skipped + ' replayed before).'; return; }
    if (!confirm('Replay ' + dry.matched + ' ended task(s)?')) return;
    const done = await act('/api/tasks/replay', q);
    findStatus.textContent = done.replayed.length + ' of ' + done.matched + ' replayed';
    await search();
  });

  async function poll() {
    try {
      const url = detailId ? base + '/api/tasks/' + detailId : base + '/api/overview';
      const res = await fetch(url, { headers: { accept: 'application/json' } });
      const body = await res.json();
      if (!res.ok) throw new Error(body.error || body.error?.message || res.statusText);
      if (detailId) {
        const logs = await fetch(base + '/api/tasks/' + detailId + '/logs?limit=1000', { headers: { accept: 'application/json' } });
        if (logs.ok) body.logs = (await logs.json()).lines;
      }
      errorBox.hidden = true;
      if (detailId) renderDetail(body); else renderOverview(body);
      document.getElementById('updated').textContent = 'updated ' + new Date().toLocaleTimeString();
      document.body.dataset.loaded = 'true';
    } catch (e) {
      errorBox.hidden = false;
      errorBox.textContent = 'Could not load: ' + e.message;
    }
  }
  if (!detailId) document.getElementById('find').hidden = false;
  if (csrf) {
    const logout = el('form', { id: 'logout', method: 'post', action: base + '/logout' },
      el('input', { type: 'hidden', name: 'csrf', value: csrf }), el('button', { type: 'submit', id: 'log-out', text: 'Log out' }));
    document.querySelector('header').append(logout);
  }
  poll();
  setInterval(poll, 1000);
})();
</script>
</body>
</html>
`;
