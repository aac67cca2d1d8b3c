import { test } from 'node:test'
import assert from 'node:assert/strict'
import { LoamError, NotFoundError, StreamInterruptedError, type WatchEvent } from '@loam/sdk'
import { sandbox, text } from './helpers.js'

test('files', async (t) => {
  const box = await sandbox(t, 'ts-files')
  const home = '/home/loam'

  await t.test('write, read as text, bytes and a stream, stat', async () => {
    const info = await box.writeFile(`${home}/a/b/hello.txt`, 'hello, files\n', { mode: '0600' })
    assert.equal(info.type, 'file')
    assert.equal(info.size, 13)
    assert.equal(info.mode, '0600')
    assert.equal(await box.readText(`${home}/a/b/hello.txt`), 'hello, files\n')

    const all = new Uint8Array(256 * 1024).map((_, i) => (i * 7) % 256)
    await box.writeFile(`${home}/bin.dat`, all)
    assert.deepEqual(await box.readFile(`${home}/bin.dat`), all)
    let n = 0
    const reader = (await box.readStream(`${home}/bin.dat`)).getReader()
    for (let r = await reader.read(); !r.done; r = await reader.read()) n += r.value.length
    assert.equal(n, all.length)
    const st = await box.stat(`${home}/bin.dat`)
    assert.equal(st.size, all.length)
    assert.equal(st.entries, undefined)
    await assert.rejects(box.readText(`${home}/nope`), NotFoundError)
    assert.deepEqual(await box.readFile(`${home}/bin.dat`, { offset: 1000, length: 300 }), all.slice(1000, 1300))
    assert.deepEqual(await box.readFile(`${home}/bin.dat`, { offset: all.length - 10 }), all.slice(all.length - 10))
    assert.equal((await box.readFile(`${home}/bin.dat`, { offset: all.length + 5, length: 3 })).length, 0)
    assert.equal(await box.readText(`${home}/a/b/hello.txt`, { length: 5 }), 'hello')
    await assert.rejects(box.readFile(`${home}/bin.dat`, { offset: -1 }), (e: unknown) => e instanceof LoamError && e.code === 'invalid')
    assert.equal((await box.run(['id', '-un'], {})).stdout, 'loam\n')
    assert.equal((await box.run(['stat', '-c', '%U', `${home}/bin.dat`])).stdout, 'loam\n')
  })

  await t.test('mkdir, list, move, remove', async () => {
    const dir = await box.mkdir(`${home}/d/e`, { mode: '0750' })
    assert.equal(dir.type, 'dir')
    assert.equal(dir.mode, '0750')
    await box.writeFile(`${home}/d/one`, '1')
    const moved = await box.move(`${home}/d/one`, `${home}/d/e/two`)
    assert.equal(moved.path, `${home}/d/e/two`)
    const list = await box.listFiles(`${home}/d`, { depth: 2 })
    assert.deepEqual(list.entries?.map((e) => [e.path, e.type, e.entries?.map((x) => x.path)]), [[`${home}/d/e`, 'dir', [`${home}/d/e/two`]]])
    await assert.rejects(box.remove(`${home}/d`), LoamError)
    await box.remove(`${home}/d`, { recursive: true })
    await assert.rejects(box.stat(`${home}/d`), NotFoundError)
    // As root: a file loam may not write.
    const rootFile = await box.writeFile('/root/secret', 'x', { user: 'root' })
    assert.equal(rootFile.path, '/root/secret')
    await assert.rejects(box.readText('/root/secret'))
    assert.equal(await box.readText('/root/secret', { user: 'root' }), 'x')
  })

  await t.test('an archive round trip', async () => {
    await box.writeFile(`${home}/tree/x.txt`, 'x content')
    await box.writeFile(`${home}/tree/sub/y.txt`, 'y content')
    const tar = await new Response(await box.downloadArchive(`${home}/tree`)).arrayBuffer()
    assert.ok(tar.byteLength >= 1024)
    await box.uploadArchive(`${home}/copy`, new Uint8Array(tar))
    assert.equal(await box.readText(`${home}/copy/x.txt`), 'x content')
    assert.equal(await box.readText(`${home}/copy/sub/y.txt`), 'y content')
    // And one made in the sandbox, unpacked by the API.
    await box.run(['sh', '-c', `mkdir -p /tmp/t && echo made > /tmp/t/m.txt && tar -cf ${home}/made.tar -C /tmp/t .`])
    await box.uploadArchive(`${home}/unpacked`, await box.readFile(`${home}/made.tar`))
    assert.equal(await box.readText(`${home}/unpacked/m.txt`), 'made\n')
  })

  await t.test('watch', async () => {
    await box.mkdir(`${home}/w`)
    const w = await box.watch(`${home}/w`)
    const events: WatchEvent[] = []
    // The watch is set up once the socket is open: what is made now is seen.
    await box.writeFile(`${home}/w/new.txt`, 'n')
    for await (const ev of w) {
      events.push(ev)
      if (ev.path === `${home}/w/new.txt` && (ev.type === 'create' || ev.type === 'rename')) break
    }
    assert.ok(events.some((e) => e.path === `${home}/w/new.txt`), JSON.stringify(events))

    // A memory checkpoint ends a watch with StreamInterruptedError.
    const w2 = await box.watch(`${home}/w`)
    const cp = await box.createCheckpoint({ comment: 'ends the watch' })
    await assert.rejects(
      (async () => {
        for await (const ev of w2) void ev
      })(),
      StreamInterruptedError,
    )
    await box.deleteCheckpoint(cp.id)
  })

  await t.test('an aborted read', async () => {
    const ctl = new AbortController()
    ctl.abort(new Error('no thanks'))
    await assert.rejects(box.readFile(`${home}/bin.dat`, { signal: ctl.signal }), { message: 'no thanks' })
    assert.equal(text(await box.readFile(`${home}/a/b/hello.txt`)), 'hello, files\n')
  })
})
