/*
 * Test-only probe of DJL's streamed reply buffer (ai.djl:api's ChunkedBytesSupplier), for
 * tests/integration/test_djl_chunk_race.py.
 *
 * DJL's HTTP writer (InferenceRequestHandler) sends a streamed reply with
 * "while (supplier.hasNext()) { chunk = supplier.nextChunk(...); ... }" and writes the response
 * header only inside that loop. The worker's reader thread appends each record with
 * appendContent(bytes, last). When a reply is one last chunk, hasNext() can be false before that
 * chunk is queued (the buffer is marked complete first), so the writer's loop never runs and the
 * client gets no header at all. This probe races the two calls: one thread appends a single last
 * chunk while another asks hasNext() as the writer does, and counts the rounds where the writer
 * was told "no more chunks" although a chunk was then queued (a reply the client never gets).
 *
 * Run with Java 17's single-file launcher:
 *   java -cp 'lib/*' ChunkRaceProbe.java ROUNDS
 * Prints "lost N of ROUNDS".
 */

import ai.djl.inference.streaming.ChunkedBytesSupplier;

import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

public final class ChunkRaceProbe {

    private ChunkRaceProbe() {}

    public static void main(String[] args) throws Exception {
        int rounds = Integer.parseInt(args[0]);
        int lost = 0;
        ExecutorService pool = Executors.newFixedThreadPool(2);
        try {
            for (int i = 0; i < rounds; i++) {
                ChunkedBytesSupplier reply = new ChunkedBytesSupplier();
                CountDownLatch start = new CountDownLatch(1);
                Future<?> worker = pool.submit(() -> {
                    start.await();
                    reply.appendContent(new byte[] {'{', '}'}, true);
                    return null;
                });
                Future<Boolean> writer = pool.submit(() -> {
                    start.await();
                    for (int k = 0; k < 1000; k++) {
                        if (!reply.hasNext()) {
                            return true; // the writer's loop would end here, before any header
                        }
                    }
                    return false;
                });
                start.countDown();
                worker.get();
                if (writer.get() && reply.pollChunk() != null) {
                    lost++;
                }
            }
        } finally {
            pool.shutdownNow();
        }
        System.out.println("lost " + lost + " of " + rounds);
    }
}
