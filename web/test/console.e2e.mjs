// The console's end-to-end test, run by TestConsole (test/console/console_test.go)
// against a real daemon, in headless Chromium (Debian's, driven by
// playwright-core): log in, create a sandbox (the API's validation message
// shown first), run a command in the terminal, checkpoint, change a file,
// restore, see the file back (in the terminal and by download), fork, see
// the fork's process running; a restart of the daemon under the open page;
// services' logs, stop, start and restart, upload, sleep, wake, delete
// (from the list and from a sandbox's page), the audit log, log out. A screenshot of each
// step goes to LOAM_ARTIFACTS.
//
// Environment: LOAM_URL, LOAM_TOKEN (the daemon's), LOAM_ARTIFACTS (a
// directory), LOAM_TEMPLATE (the template to create from), CHROMIUM (the
// browser; /usr/bin/chromium by default).
import { chromium } from 'playwright-core'
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { createInterface } from 'node:readline'

const url = need('LOAM_URL')
const token = need('LOAM_TOKEN')
const tokenFile = need('LOAM_TOKEN_FILE')
const readKey = need('LOAM_READ_KEY')
const artifacts = need('LOAM_ARTIFACTS')
const template = process.env.LOAM_TEMPLATE ?? 'base'
const name = 'web1'
const forkName = 'web1-fork'
const fork2Name = 'web1-fork2'
const slow = { timeout: 120_000 }

function need (k) {
  const v = process.env[k]
  if (!v) throw new Error(`${k} is not set`)
  return v
}

mkdirSync(artifacts, { recursive: true })
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  // Root (as the tests run) needs Chromium's own sandbox off.
  args: ['--no-sandbox', '--disable-dev-shm-usage'],
})
const context = await browser.newContext({ viewport: { width: 1440, height: 1000 }, acceptDownloads: true })
const page = await context.newPage()
const problems = []
page.on('pageerror', e => problems.push(`page error: ${e.message}`))
// The browser's own console errors (a refused request, a socket a
// restore closed) are expected: logged, not failures.
page.on('console', m => { if (m.type() === 'error') console.log(`browser console: ${m.text()}`) })
let n = 0
const shot = async (what) => {
  n++
  await page.screenshot({ path: join(artifacts, `${String(n).padStart(2, '0')}-${what}.png`), fullPage: true })
  console.log(`step ${n}: ${what}`)
}
const id = (t) => page.getByTestId(t)
const terminalText = () => page.locator('.xterm-rows').innerText()
const waitTerminal = async (text) => {
  await page.locator('.xterm-rows').filter({ hasText: text }).waitFor(slow)
}
const type = async (line) => {
  await page.locator('.xterm-helper-textarea').focus()
  await page.keyboard.type(line + '\n', { delay: 5 })
}
const tab = async (t) => { await id(`tab-${t}`).click() }
// restartDaemon asks the test that runs this script (on stdout) to
// restart the daemon, and waits until it says it did (on stdin).
const stdin = createInterface({ input: process.stdin })[Symbol.asyncIterator]()
const restartDaemon = async () => {
  console.log('loam-e2e: restart the daemon')
  const { value, done } = await stdin.next()
  if (done || value.trim() !== 'restarted') throw new Error(`the test did not restart the daemon: ${value}`)
}
const attachedAgain = async (count) => {
  await id('terminal-status').filter({ hasText: `attached again (${count})` }).waitFor(slow)
}

try {
  // Log in: a wrong token is refused with the daemon's message.
  await page.goto(url)
  // The hint names the file this daemon keeps its token in.
  await id('login-hint').filter({ hasText: tokenFile }).waitFor()
  await id('token').fill('loam_wrong')
  await id('login').click()
  await page.getByRole('alert').filter({ hasText: 'wrong token' }).waitFor()
  await id('token').fill(token)
  await id('login').click()
  await id('new-sandbox').waitFor()
  await shot('logged-in')
  const cookies = await context.cookies()
  const session = cookies.find(c => c.name === 'loam_console')
  if (!session || !session.httpOnly || session.sameSite !== 'Strict') throw new Error(`session cookie not HttpOnly and SameSite=Strict: ${JSON.stringify(session)}`)

  // Create: first with a name the API refuses, its message shown.
  await id('new-sandbox').click()
  await id('create-name').fill('Not A Name!')
  await id('create-submit').click()
  await id('create-form').getByTestId('error').waitFor()
  const refusal = await id('create-form').getByTestId('error').innerText()
  if (!/name/i.test(refusal)) throw new Error(`the create's refusal does not name the field: ${refusal}`)
  await shot('create-refused')
  await id('create-name').fill(name)
  await id('create-cpus').fill('lots')
  await id('create-submit').click()
  await id('create-form').getByTestId('error').filter({ hasText: 'resources.cpus: must be a number' }).waitFor()
  await id('create-cpus').fill('')
  await id('create-template').selectOption(template)
  await id('create-labels').fill('team=console')
  await id('create-services').fill('ticker=while true; do echo tick; sleep 1; done\nweb=exec python3 -m http.server 8080')
  await id('create-submit').click()
  await id('sandbox-name').filter({ hasText: name }).waitFor(slow)
  await id('state').filter({ hasText: 'running' }).waitFor(slow)
  // Made without an idle, on a daemon without --idle: it never sleeps.
  await id('idle').filter({ hasText: "never sleeps (the daemon's default)" }).waitFor()
  await shot('created')

  // The list, filtered by the label.
  await page.goto(url + '/#/')
  await id('filter').fill('team=console')
  await id('filter').press('Enter')
  await id(`row-${name}`).waitFor()
  // CPU and memory in use: cores from two readings of its CPU time (one
  // refresh apart), and the memory its cgroup holds against its limit.
  await id(`row-${name}`).getByTestId('usage').filter({ hasText: /^\d+\.\d\d of [\d.]+ CPU \/ [\d.]+ [KMG]i?B of \d+ MiB$/ }).waitFor(slow)
  await shot('list-filtered')
  await id(`row-${name}`).getByRole('link', { name, exact: true }).click()

  // A command in the terminal, leaving a process running and a file.
  await tab('terminal')
  await id('terminal-status').filter({ hasText: 'session' }).waitFor(slow)
  await type('echo v1 > note.txt; nohup sleep 4242 >/dev/null 2>&1 & echo "started-$((6*7))"')
  await waitTerminal('started-42')
  await shot('terminal')

  // A memory checkpoint: the terminal is cut, says so, and attaches again.
  await tab('timeline')
  await id('checkpoint-name').fill('clean')
  await id('checkpoint-comment').fill('before the edit')
  await id('checkpoint').click()
  await id('checkpoint-v1').waitFor(slow)
  await shot('checkpointed')
  await tab('terminal')
  await attachedAgain(1)
  await type('echo changed > note.txt; echo "now: $(cat note.txt)"')
  await waitTerminal('now: changed')
  await shot('file-changed')

  // Restore to v1: the state before is kept as auto-1, the file is back.
  await tab('timeline')
  await id('checkpoint-v1').getByTestId('restore').click()
  await id('confirm-yes').click()
  await id('confirm').waitFor({ state: 'detached', ...slow })
  await id('checkpoint-auto-1').waitFor(slow)
  const auto = await id('checkpoint-auto-1').innerText()
  if (!/before restoring v1/.test(auto)) throw new Error(`auto-1 does not say what it was taken before: ${auto}`)
  await shot('restored')
  await tab('terminal')
  await attachedAgain(2)
  await type('echo "back: $(cat note.txt)"')
  await waitTerminal('back: v1')
  await shot('file-back')

  // The daemon restarts under the open page: the session cookie is kept
  // (in the daemon's database), and the terminal attaches to its shell,
  // which ran on in the sandbox, once the daemon answers again.
  await restartDaemon()
  await attachedAgain(3)
  await type('echo "after restart: $(cat note.txt)"')
  await waitTerminal('after restart: v1')
  await shot('daemon-restarted')

  // The file browser: the file's content by download, and an upload.
  await tab('files')
  await id('file-note.txt').waitFor(slow)
  const [download] = await Promise.all([page.waitForEvent('download'), id('file-note.txt').getByTestId('download').click()])
  const got = readFileSync(await download.path(), 'utf8')
  if (got !== 'v1\n') throw new Error(`note.txt downloaded as ${JSON.stringify(got)}, want "v1\\n"`)
  const upload = join(artifacts, 'upload.txt')
  writeFileSync(upload, 'uploaded from the console\n')
  await id('files-upload').setInputFiles(upload)
  await id('file-upload.txt').waitFor(slow)
  await shot('files')

  // The service the create started, and its logs.
  await tab('services')
  await id('logs-ticker').click({ timeout: 30_000 })
  await id('service-logs').filter({ hasText: 'tick' }).waitFor(slow)
  await shot('service-logs')

  // Stop, start and restart a service from its row; a restart runs it as
  // a new process.
  const svc = id('service-ticker')
  await svc.getByTestId('service-stop').click()
  await svc.getByTestId('service-state').filter({ hasText: 'stopped' }).waitFor(slow)
  await svc.getByTestId('service-start').click()
  await svc.getByTestId('service-state').filter({ hasText: 'running' }).waitFor(slow)
  const pid = await svc.getByTestId('service-pid').innerText()
  if (!/^\d+$/.test(pid)) throw new Error(`the started service shows pid ${JSON.stringify(pid)}`)
  await svc.getByTestId('service-restart').click()
  await page.waitForFunction((p) => {
    const row = document.querySelector('[data-testid=service-ticker]')
    const now = row?.querySelector('[data-testid=service-pid]')?.textContent
    return row?.querySelector('[data-testid=service-state]')?.textContent === 'running' && /^\d+$/.test(now ?? '') && now !== p
  }, pid, slow)
  await shot('service-actions')

  // Fork from v1: the fork links back to its origin, and its process runs.
  await tab('timeline')
  await id('checkpoint-v1').getByTestId('fork').click()
  await id('fork-name').fill(forkName)
  await id('fork-submit').click()
  await id('sandbox-name').filter({ hasText: forkName }).waitFor(slow)
  await id('fork-origin').filter({ hasText: name }).waitFor()
  await id('state').filter({ hasText: 'running' }).waitFor(slow)
  await tab('terminal')
  await id('terminal-status').filter({ hasText: 'session' }).waitFor(slow)
  await type('echo "procs: $(ps ax | grep -c "[s]leep 4242")"; echo "fork: $(cat note.txt)"')
  await waitTerminal('procs: 1')
  await waitTerminal('fork: v1')
  await shot('fork-process')

  // The terminal follows the page's size: stty in the shell agrees.
  const before = await id('terminal').getAttribute('data-size')
  await page.setViewportSize({ width: 1000, height: 700 })
  await page.waitForFunction((b) => document.querySelector('[data-testid=terminal]')?.getAttribute('data-size') !== b, before)
  const size = await id('terminal').getAttribute('data-size')
  await type('echo "size: $(stty size)"')
  await waitTerminal(`size: ${size}`)
  await shot('terminal-resized')
  await page.setViewportSize({ width: 1440, height: 1000 })

  // The shell the origin ran at v1 runs in the fork too, as a detachable
  // session: attached to, its output from before the checkpoint replays.
  await id('list-sessions').click()
  await page.locator('[data-testid^="attach-"]').first().click()
  await id('terminal-status').filter({ hasText: 'attached (1)' }).waitFor(slow)
  await waitTerminal('started-42')
  await shot('fork-attached')

  // Back at the origin: v1 links to its fork.
  await id('fork-origin').getByRole('link', { name, exact: true }).click()
  await id('sandbox-name').filter({ hasText: name }).waitFor()
  await id('checkpoint-v1').getByTestId('forks').filter({ hasText: forkName }).waitFor(slow)

  // A disk-only checkpoint is drawn as one.
  await id('checkpoint-name').fill('disk')
  await id('checkpoint-comment').fill('disk only, after the restore')
  await id('checkpoint-memory').uncheck()
  await id('checkpoint').click()
  await id('checkpoint-v2').filter({ hasText: 'disk only' }).waitFor(slow)
  await shot('timeline')
  await id('timeline').screenshot({ path: join(artifacts, 'timeline.png') })

  // The sandbox's URL opens in a new tab, with its access token (it is
  // private): the service's web server answers.
  const [tab2] = await Promise.all([context.waitForEvent('page'), id('open-url').click()])
  await tab2.getByText('Directory listing').first().waitFor(slow)
  await tab2.screenshot({ path: join(artifacts, `${String(++n).padStart(2, '0')}-sandbox-url.png`) })
  console.log(`step ${n}: sandbox-url`)
  await tab2.close()

  // A checkpoint deleted from the timeline, after a confirmation.
  await id('checkpoint-v2').getByTestId('delete-checkpoint').click()
  await id('confirm').filter({ hasText: 'cannot be undone' }).waitFor()
  await id('confirm-yes').click()
  await id('checkpoint-v2').waitFor({ state: 'detached', ...slow })

  // Sleep, wake and delete the fork from the list.
  await page.goto(url + '/#/')
  await id('filter').fill('')
  await id('filter').press('Enter')
  const row = id(`row-${forkName}`)
  await row.getByTestId('sleep').click()
  await row.getByTestId('state').filter({ hasText: 'sleeping' }).waitFor(slow)
  await shot('fork-asleep')
  await row.getByTestId('wake').click()
  await row.getByTestId('state').filter({ hasText: 'running' }).waitFor(slow)
  await row.getByTestId('delete').click()
  await id('confirm').filter({ hasText: 'cannot be undone' }).waitFor()
  await shot('delete-confirm')
  await id('confirm-yes').click()
  await row.waitFor({ state: 'detached', ...slow })
  await shot('fork-deleted')

  // Another fork, deleted from its own page: the page goes back to the
  // list, which no longer has it.
  await id(`row-${name}`).getByRole('link', { name, exact: true }).click()
  await tab('timeline')
  await id('checkpoint-v1').getByTestId('fork').click()
  await id('fork-name').fill(fork2Name)
  await id('fork-submit').click()
  await id('sandbox-name').filter({ hasText: fork2Name }).waitFor(slow)
  await id('state').filter({ hasText: 'running' }).waitFor(slow)
  await id('sandbox-page').locator('.toolbar').first().getByTestId('delete').click()
  await id('confirm').filter({ hasText: 'cannot be undone' }).waitFor()
  await id('confirm-yes').click()
  await id(`row-${name}`).waitFor(slow)
  await id(`row-${fork2Name}`).waitFor({ state: 'detached', ...slow })
  await shot('fork-deleted-from-its-page')

  // The audit log: the changes made above, newest first, each with its
  // key and outcome; filtered by action, only that action's.
  await id('nav-audit').click()
  await id('audit-table').waitFor(slow)
  const created = id('audit-table').locator('tr[data-action="sandbox.create"]').filter({ hasText: `sandboxes/${name}` })
  await created.first().waitFor()
  const text = await created.first().innerText()
  if (!text.includes('ok') || !text.includes('admin')) throw new Error(`the create of ${name} in the audit log: ${text}`)
  await id('audit-action').fill('sandbox.fork')
  await id('audit-action').press('Tab')
  await id('audit-count').filter({ hasText: /^2 events$/ }).waitFor(slow)
  const forks = await id('audit-table').locator('tbody tr').evaluateAll(rows => rows.map(r => r.dataset.action + ' ' + r.innerText))
  if (forks.length !== 2 || forks.some(f => !f.startsWith('sandbox.fork '))) throw new Error(`forks in the audit log: ${forks.join(' | ')}`)
  if (!forks[0].includes(fork2Name)) throw new Error(`the newest fork is not first: ${forks.join(' | ')}`)
  await shot('audit-log')
  await page.goto(url + '/#/')

  // Log out: the cookie no longer opens the API.
  await id('logout').click()
  await id('token').waitFor()
  const after = await page.evaluate(async () => (await fetch('/v1/sandboxes', { headers: { 'X-Loam-CSRF': 'x' } })).status)
  if (after !== 401) throw new Error(`after logout the API answered ${after}, want 401`)
  await shot('logged-out')

  // A read key logs in too: what it may not do is shown disabled, not
  // refused after the click.
  await id('token').fill(readKey)
  await id('login').click()
  await id('who').filter({ hasText: '(read)' }).waitFor()
  await id(`row-${name}`).waitFor(slow)
  for (const t of ['new-sandbox']) {
    if (!await id(t).isDisabled()) throw new Error(`${t} is enabled for a read key`)
  }
  await id(`row-${name}`).getByRole('link', { name, exact: true }).click()
  await id('sandbox-name').filter({ hasText: name }).waitFor(slow)
  for (const t of ['tab-terminal', 'tab-files', 'checkpoint', 'delete']) {
    const b = id('sandbox-page').getByTestId(t).first()
    if (!await b.isDisabled()) throw new Error(`${t} is enabled for a read key`)
  }
  if (await id('tab-timeline').isDisabled()) throw new Error('the timeline is disabled for a read key')
  // The audit log is an admin's: shown disabled, saying why.
  if (await id('nav-audit').getAttribute('aria-disabled') !== 'true') throw new Error('the audit log is enabled for a read key')
  await shot('read-key')
  await id('logout').click()
  await id('token').waitFor()
  if (problems.length > 0) throw new Error(problems.join('\n'))
  console.log('console e2e: ok')
} catch (e) {
  await page.screenshot({ path: join(artifacts, 'failure.png'), fullPage: true }).catch(() => {})
  console.error('terminal:', await terminalText().catch(() => ''))
  console.error(e)
  process.exitCode = 1
} finally {
  await browser.close()
  stdin.return?.()
}
