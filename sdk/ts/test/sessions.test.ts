import { test } from 'node:test'
import assert from 'node:assert/strict'
import { NotFoundError, type OffsetEvent } from '@loam/sdk'
import { sandbox, text, until } from './helpers.js'

test('sessions', async (t) => {
  const box = await sandbox(t, 'ts-sessions')

  await t.test('start, get, list, attach from an offset, signal, wait', async () => {
    const s = await box.startSession(['sh', '-c', 'printf "one\\ntwo\\n"; exec sleep 60'])
    assert.equal(s.state, 'running')
    assert.equal(s.detachable, true)
    assert.ok((await box.sessions()).some((x) => x.id === s.id))
    assert.equal((await box.getSession(s.id)).pid, s.pid)

    // Wait for the output, then read it from byte 4 on without following.
    let replay = ''
    await until('the session output', async () => {
      replay = ''
      const p = await box.attach(s.id, { follow: false })
      for await (const c of p) replay += text(c.data)
      return replay === 'one\ntwo\n'
    })
    const offsets: OffsetEvent[] = []
    const p = await box.attach(s.id, { offset: 4, follow: false, onOffset: (ev) => offsets.push(ev) })
    let out = ''
    for await (const c of p) out += text(c.data)
    assert.equal(out, 'two\n')
    assert.equal(await p.wait(), null, 'a session still running has no exit code')
    assert.deepEqual(offsets.find((o) => o.stream === 'stdout'), { stream: 'stdout', offset: 4, dropped: 0 })

    await box.signalSession(s.id, 'TERM')
    const done = await box.waitSession(s.id)
    assert.equal(done.state, 'exited')
    assert.equal(done.exit_code, 128 + 15)
  })

  await t.test('an attach that follows sees live output and the exit', async () => {
    const s = await box.startSession(['sh', '-c', 'echo a; sleep 0.5; echo b; exit 4'])
    const p = await box.attach(s.id)
    let out = ''
    for await (const c of p) out += text(c.data)
    assert.equal(out, 'a\nb\n')
    assert.equal(await p.wait(), 4)
  })

  await t.test('stdin through an attach', async () => {
    const s = await box.startSession(['sh', '-c', 'read x; echo "read $x"'], { stdin: true })
    const p = await box.attach(s.id, { stdin: 'typed\n' })
    let out = ''
    for await (const c of p) out += text(c.data)
    assert.equal(out, 'read typed\n')
    assert.equal(await p.wait(), 0)
  })

  await t.test('a detachable exec runs on after its socket closes', async () => {
    const p = await box.exec(['sh', '-c', 'sleep 0.5; echo later'], { detachable: true })
    const { sessionId } = await p.started
    p.close()
    const done = await box.waitSession(sessionId)
    assert.equal(done.exit_code, 0)
    const again = await box.attach(sessionId, { follow: false })
    let out = ''
    for await (const c of again) out += text(c.data)
    assert.equal(out, 'later\n')
  })

  await t.test('delete kills a session', async () => {
    const s = await box.startSession(['sleep', '60'])
    await box.deleteSession(s.id)
    await assert.rejects(box.getSession(s.id), NotFoundError)
    const r = await box.run(['sh', '-c', `kill -0 ${s.pid} 2>/dev/null && echo alive || echo gone`])
    assert.equal(r.stdout, 'gone\n')
  })
})
