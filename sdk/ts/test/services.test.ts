import { test } from 'node:test'
import assert from 'node:assert/strict'
import { NotFoundError, InvalidError } from '@loam/sdk'
import { sandbox, text, until } from './helpers.js'

test('services', async (t) => {
  const box = await sandbox(t, 'ts-services')

  const def = { name: 'ticker', cmd: ['sh', '-c', 'echo started $WHO; echo warn >&2; exec sleep 60'], env: { WHO: 'me' } }
  const put = await box.putService(def)
  assert.equal(put.name, 'ticker')
  assert.deepEqual(put.cmd, def.cmd)
  await until('the service running', async () => (await box.getService('ticker')).state === 'running')
  assert.deepEqual((await box.services()).map((s) => s.name), ['ticker'])

  let out = ''
  let err = ''
  await until('its logs', async () => {
    out = ''
    err = ''
    for await (const c of box.serviceLogs('ticker')) {
      if (c.stream === 'stdout') out += text(c.data)
      else err += text(c.data)
    }
    return out.length > 0 && err.length > 0
  })
  assert.equal(out, 'started me\n')
  assert.equal(err, 'warn\n')
  // From an offset: what follows byte 8 of stdout.
  const tail = { stdout: '', stderr: '' }
  for await (const c of box.serviceLogs('ticker', { offset: 8, stderrOffset: 3 })) tail[c.stream] += text(c.data)
  assert.deepEqual(tail, { stdout: 'me\n', stderr: 'n\n' })

  const stopped = await box.stopService('ticker')
  assert.equal(stopped.state, 'stopped')
  await box.startService('ticker')
  let pid = 0
  await until('the service started again', async () => {
    const s = await box.getService('ticker')
    pid = s.pid ?? 0
    return s.state === 'running'
  })
  await box.restartService('ticker')
  await until('the service restarted with a new pid', async () => {
    const s = await box.getService('ticker')
    return s.state === 'running' && s.pid !== pid
  })

  await assert.rejects(box.putService({ name: 'Bad Name', cmd: ['true'] }), InvalidError)
  await box.deleteService('ticker')
  await assert.rejects(box.getService('ticker'), NotFoundError)
})
