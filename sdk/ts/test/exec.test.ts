import { test } from 'node:test'
import assert from 'node:assert/strict'
import loam, { Loam, StreamEndedError, StreamInterruptedError, type OutputChunk } from '@loam/sdk'
import { sandbox, text } from './helpers.js'

test('exec', async (t) => {
  const box = await sandbox(t, 'ts-exec', { env: { GREETING: 'hi' } })

  await t.test('run gives the exit code and both streams', async () => {
    const r = await box.run(['sh', '-c', 'echo $GREETING from $(hostname); echo oops >&2; exit 7'])
    assert.deepEqual(r, { exitCode: 7, stdout: 'hi from ts-exec\n', stderr: 'oops\n' })
  })

  await t.test('env, dir and user', async () => {
    const r = await box.run(['sh', '-c', 'echo $A $(pwd) $(id -un)'], { env: { A: 'b' }, dir: '/tmp', user: 'root' })
    assert.equal(r.stdout, 'b /tmp root\n')
  })

  await t.test('stdin from a string, bytes and an async iterable', async () => {
    assert.equal((await box.run(['cat'], { stdin: 'from a string' })).stdout, 'from a string')
    assert.equal((await box.run(['wc', '-c'], { stdin: new Uint8Array(200_000).fill(65) })).stdout.trim(), '200000')
    async function* lines() {
      for (let i = 0; i < 3; i++) yield `line ${i}\n`
    }
    assert.equal((await box.run(['sort', '-r'], { stdin: lines() })).stdout, 'line 2\nline 1\nline 0\n')
  })

  await t.test('output streams as it comes, and stdin can be written while it runs', async () => {
    const p = await box.exec(['sh', '-c', 'echo ready; read line; echo "got $line"; echo bye >&2'], { stdin: true })
    const { pid, sessionId } = await p.started
    assert.ok(pid > 0)
    assert.match(sessionId, /^s-[a-z0-9]+$/)
    const seen: OutputChunk[] = []
    for await (const c of p) {
      seen.push(c)
      // The command waits for this line: it can only come after "ready" was read.
      if (text(c.data).includes('ready')) {
        p.write('hello\n')
        p.closeStdin()
      }
    }
    assert.equal(await p.wait(), 0)
    const out = (s: string) => seen.filter((c) => c.stream === s).map((c) => text(c.data)).join('')
    assert.equal(out('stdout'), 'ready\ngot hello\n')
    assert.equal(out('stderr'), 'bye\n')
  })

  await t.test('kill sends a signal', async () => {
    const p = await box.exec(['sleep', '60'])
    await p.started
    p.kill('KILL')
    assert.equal(await p.wait(), 128 + 9)
  })

  await t.test('tty with resize', async () => {
    const p = await box.exec(['sh', '-c', 'stty size; read x; stty size'], { tty: true, rows: 24, cols: 80, stdin: true })
    let out = ''
    let resized = false
    for await (const c of p) {
      assert.equal(c.stream, 'stdout')
      out += text(c.data)
      // The second stty runs only after this line: it must see the new size.
      if (!resized && out.includes('24 80\r\n')) {
        resized = true
        p.resize(40, 100)
        p.write('\r')
      }
    }
    assert.equal(await p.wait(), 0)
    assert.match(out, /24 80\r\n[\s\S]*40 100\r\n/)
  })

  await t.test('a command that cannot start rejects with the API error', async () => {
    await assert.rejects(box.run(['/no/such/program']), (e: Error) => e.name !== 'StreamEndedError' && /no\/such\/program/.test(e.message))
  })

  await t.test('the subprotocol carries the token, as in a browser', async () => {
    const browserish = new Loam({ url: process.env.LOAM_API_URL, token: process.env.LOAM_TOKEN, webSocketAuth: 'subprotocol' })
    assert.equal((await browserish.sandbox('ts-exec').run(['echo', 'via subprotocol'])).stdout, 'via subprotocol\n')
    const wrong = new Loam({ url: process.env.LOAM_API_URL, token: 'wrong', webSocketAuth: 'subprotocol' })
    await assert.rejects(wrong.sandbox('ts-exec').run(['true']), { name: 'UnauthorizedError', status: 401 })
  })

  await t.test('an AbortSignal ends a run', async () => {
    const ctl = new AbortController()
    const started = Date.now()
    setTimeout(() => ctl.abort(new Error('enough')), 300)
    await assert.rejects(box.run(['sleep', '30'], { signal: ctl.signal }), { message: 'enough' })
    assert.ok(Date.now() - started < 10_000)
    await assert.rejects(box.run(['true'], { signal: ctl.signal }), { message: 'enough' })
  })

  await t.test('a timeout ends a run', async () => {
    await assert.rejects(box.run(['sleep', '30'], { timeout: 300 }), { name: 'TimeoutError' })
  })

  await t.test('a memory checkpoint ends an open exec with StreamInterruptedError', async () => {
    const p = await box.exec(['sleep', '60'])
    await p.started
    const cp = await box.createCheckpoint({ comment: 'interrupt' })
    await assert.rejects(p.wait(), StreamInterruptedError)
    // So does a restore.
    const r = await box.exec(['sleep', '60'])
    await r.started
    await box.restoreCheckpoint(cp.id)
    await assert.rejects(r.wait(), StreamInterruptedError)
    await box.deleteCheckpoint(cp.id)
    // Any other ending is not that error.
    const q = await box.exec(['sleep', '60'])
    await q.started
    q.close()
    await assert.rejects(q.wait(), (e: Error) => e instanceof StreamEndedError && !(e instanceof StreamInterruptedError))
  })
})

test('loam.run through the default client sees the sandbox by id too', async (t) => {
  const box = await sandbox(t, 'ts-exec-id')
  const info = await box.info()
  assert.equal((await loam.sandbox(info.id).run(['hostname'])).stdout, 'ts-exec-id\n')
})
