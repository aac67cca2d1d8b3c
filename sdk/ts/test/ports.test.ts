import { test } from 'node:test'
import assert from 'node:assert/strict'
import { NotFoundError, StreamInterruptedError, type PortEvent } from '@loam/sdk'
import { sandbox, text, until } from './helpers.js'

test('ports', async (t) => {
  const box = await sandbox(t, 'ts-ports')
  const watch = await box.watchPorts()
  const events: PortEvent[] = []
  const watching = (async () => {
    for await (const ev of watch) {
      events.push(ev)
      if (ev.type === 'close' && ev.port === 8080) return
    }
  })()

  // An echo server: busybox nc, listening again after each connection.
  const server = await box.startSession(['busybox', 'nc', '-ll', '-p', '8080', '-e', 'cat'])
  await until('port 8080 listed', async () => (await box.ports()).some((p) => p.port === 8080))
  const port = (await box.ports()).find((p) => p.port === 8080)
  assert.equal(port?.loopback, false)

  for (const msg of ['ping\n', 'x'.repeat(300_000) + '\n']) {
    const conn = await box.connect(8080)
    conn.write(msg)
    let got = ''
    for await (const b of conn) {
      got += text(b)
      if (got.length >= msg.length) break
    }
    assert.equal(got, msg)
  }
  await assert.rejects(box.connect(9), NotFoundError)

  // The watch looks every quarter second or so: a port open for less is
  // missed, so the server stays up until the watch has seen it.
  await until('the open event', async () => events.some((e) => e.type === 'open' && e.port === 8080))
  await box.deleteSession(server.id)
  await watching
  assert.deepEqual(events.filter((e) => e.port === 8080), [
    { type: 'open', port: 8080 },
    { type: 'close', port: 8080 },
  ])
  // A memory checkpoint ends port streams and watches with
  // StreamInterruptedError; the server runs on.
  await box.startSession(['busybox', 'nc', '-ll', '-p', '8080', '-e', 'cat'])
  await until('port 8080 listed again', async () => (await box.ports()).some((p) => p.port === 8080))
  const watch2 = await box.watchPorts()
  const watching2 = (async () => {
    for await (const ev of watch2) void ev
  })()
  watching2.catch(() => undefined)
  const open = await box.connect(8080)
  open.write('before\n')
  const reading = (async () => {
    for await (const b of open) void b
  })()
  reading.catch(() => undefined) // asserted below, once the checkpoint is taken
  const cp = await box.createCheckpoint({ comment: 'ends port streams' })
  await assert.rejects(reading, StreamInterruptedError)
  await assert.rejects(watching2, StreamInterruptedError)
  await box.deleteCheckpoint(cp.id)
  const after = await box.connect(8080)
  after.write('after\n')
  for await (const b of after) {
    assert.equal(text(b), 'after\n')
    break
  }
})
