/*
 * Test-only HTTP front for DJL's real Python engine (ai.djl.python:python + ai.djl:api).
 *
 * It stands in for ai.djl.serving:serving, which Maven Central does not serve on this project's
 * machines. Everything below the HTTP layer is DJL's own code: PyModel reads the option.* values,
 * PyProcess starts and initialises the djl_python worker, PyPredictor names dynamic-batch keys,
 * RollingBatch drives the step loop and turns records into chunks, status codes and headers.
 * This file only does what DJL Serving's InferenceRequestHandler/RequestParser/wlm do around
 * that: headers -> Input properties, body -> content "data", query -> content entries, a
 * single worker thread that groups up to batch_size requests within max_batch_delay ms,
 * Output code/message/properties -> HTTP status/headers, ChunkedBytesSupplier -> chunked body.
 *
 * Run with Java 17's single-file launcher:
 *   java -cp 'lib/*' -Dai.djl.offline=true PyEngineFront.java --model-dir DIR --name NAME --port P
 */

import ai.djl.inference.Predictor;
import ai.djl.inference.streaming.ChunkedBytesSupplier;
import ai.djl.modality.Input;
import ai.djl.modality.Output;
import ai.djl.ndarray.BytesSupplier;
import ai.djl.repository.zoo.Criteria;
import ai.djl.repository.zoo.ZooModel;
import ai.djl.translate.TranslateException;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executors;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

public final class PyEngineFront {

    private static final class Job {
        final Input input;
        final CompletableFuture<Output> result = new CompletableFuture<>();

        Job(Input input) {
            this.input = input;
        }
    }

    private final LinkedBlockingQueue<Job> queue = new LinkedBlockingQueue<>();
    private final Predictor<Input, Output> predictor;
    private final String modelName;
    private final int batchSize;
    private final long maxBatchDelayMs;
    private final int chunkTimeoutS;

    private PyEngineFront(Predictor<Input, Output> predictor, String modelName, Properties props) {
        this.predictor = predictor;
        this.modelName = modelName;
        this.batchSize = Integer.parseInt(props.getProperty("batch_size", "1"));
        this.maxBatchDelayMs = Long.parseLong(props.getProperty("max_batch_delay", "100"));
        this.chunkTimeoutS = Integer.parseInt(props.getProperty("option.predict_timeout", "120"));
    }

    public static void main(String[] args) throws Exception {
        String modelDir = null;
        String name = null;
        int port = 8080;
        for (int i = 0; i + 1 < args.length; i += 2) {
            switch (args[i]) {
                case "--model-dir": modelDir = args[i + 1]; break;
                case "--name": name = args[i + 1]; break;
                case "--port": port = Integer.parseInt(args[i + 1]); break;
                default: throw new IllegalArgumentException("unknown flag " + args[i]);
            }
        }
        if (modelDir == null) {
            throw new IllegalArgumentException("--model-dir is required");
        }
        Path dir = Paths.get(modelDir).toAbsolutePath();
        if (name == null) {
            name = dir.getFileName().toString();
        }
        Properties props = loadServingProperties(dir);
        Criteria.Builder<Input, Output> builder = Criteria.builder()
                .setTypes(Input.class, Output.class)
                .optModelPath(dir)
                .optModelName(name)
                .optEngine(props.getProperty("engine", "Python"));
        for (String key : props.stringPropertyNames()) {
            if (key.startsWith("option.")) {
                builder.optOption(key.substring(7), props.getProperty(key));
            } else {
                builder.optArgument(key, props.getProperty(key));
            }
        }
        if (Integer.parseInt(props.getProperty("batch_size", "1")) > 1) {
            builder.optArgument("batchifier", "stack"); // as wlm's ModelInfo.load does
        }
        long begin = System.currentTimeMillis();
        ZooModel<Input, Output> model = builder.build().loadModel();
        // newPredictor starts the Python worker and sends the init call (all option.* values).
        Predictor<Input, Output> predictor = model.newPredictor();
        System.out.println("Model " + name + " loaded in " + (System.currentTimeMillis() - begin) + " ms.");
        PyEngineFront front = new PyEngineFront(predictor, name, props);
        Thread worker = new Thread(front::workLoop, "front-worker");
        worker.setDaemon(true);
        worker.start();
        front.serve(port);
    }

    /** serving.properties plus OPTION_* env vars, as DJL Serving's ModelInfo merges them. */
    private static Properties loadServingProperties(Path dir) throws IOException {
        Properties props = new Properties();
        Path file = dir.resolve("serving.properties");
        if (Files.isRegularFile(file)) {
            try (InputStream is = Files.newInputStream(file)) {
                props.load(is);
            }
        }
        for (Map.Entry<String, String> env : System.getenv().entrySet()) {
            String key = env.getKey();
            if (key.startsWith("OPTION_")) {
                String opt = key.substring(7).toLowerCase(Locale.ROOT);
                if ("entrypoint".equals(opt)) {
                    opt = "entryPoint";
                }
                props.putIfAbsent("option." + opt, env.getValue());
            }
        }
        return props;
    }

    private void serve(int port) throws IOException {
        HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1", port), 128);
        server.setExecutor(Executors.newCachedThreadPool());
        server.createContext("/ping", ex -> send(ex, 200, "{\"status\": \"Healthy\"}\n"));
        server.createContext("/invocations", this::predict);
        server.createContext("/predictions/", ex -> {
            String rest = ex.getRequestURI().getPath().substring("/predictions/".length());
            String model = rest.split("/", 2)[0];
            if (!modelName.equals(model)) {
                send(ex, 404, "{\"code\": 404, \"type\": \"ModelNotFoundException\", \"message\": "
                        + "\"Model not found: " + model + "\"}");
                return;
            }
            predict(ex);
        });
        server.start();
        System.out.println("Inference API bind to: http://127.0.0.1:" + port);
    }

    private void workLoop() {
        while (true) {
            List<Job> jobs = new ArrayList<>();
            try {
                jobs.add(queue.take());
                long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(maxBatchDelayMs);
                while (jobs.size() < batchSize) {
                    Job next = queue.poll(deadline - System.nanoTime(), TimeUnit.NANOSECONDS);
                    if (next == null) {
                        break;
                    }
                    jobs.add(next);
                }
            } catch (InterruptedException e) {
                return;
            }
            List<Input> inputs = new ArrayList<>();
            for (Job job : jobs) {
                inputs.add(job.input);
            }
            try {
                List<Output> outputs = predictor.batchPredict(inputs);
                for (int i = 0; i < jobs.size(); ++i) {
                    jobs.get(i).result.complete(outputs.get(i));
                }
            } catch (Throwable t) {
                for (Job job : jobs) {
                    job.result.completeExceptionally(t);
                }
            }
        }
    }

    private void predict(HttpExchange ex) throws IOException {
        Input input = new Input();
        for (Map.Entry<String, List<String>> h : ex.getRequestHeaders().entrySet()) {
            input.addProperty(h.getKey().toLowerCase(Locale.ROOT), String.join(",", h.getValue()));
        }
        String query = ex.getRequestURI().getRawQuery();
        if (query != null) {
            for (String kv : query.split("&")) {
                String[] p = kv.split("=", 2);
                String value = p.length > 1 ? URLDecoder.decode(p[1], StandardCharsets.UTF_8) : "";
                input.add(URLDecoder.decode(p[0], StandardCharsets.UTF_8), value);
            }
        }
        try (InputStream is = ex.getRequestBody()) {
            input.add("data", is.readAllBytes());
        }
        Job job = new Job(input);
        queue.add(job);
        Output out;
        try {
            out = job.result.get();
        } catch (Exception e) {
            Throwable t = e.getCause() == null ? e : e.getCause();
            int code = t instanceof TranslateException ? 400 : 500;
            String msg = String.valueOf(t.getMessage()).replace("\\", "\\\\").replace("\"", "\\\"");
            send(ex, code, "{\"code\": " + code + ", \"type\": \"" + t.getClass().getSimpleName()
                    + "\", \"message\": \"" + msg + "\"}");
            return;
        }
        sendOutput(ex, out);
    }

    private void sendOutput(HttpExchange ex, Output out) throws IOException {
        BytesSupplier data = out.getData();
        if (!(data instanceof ChunkedBytesSupplier)) {
            copyHeaders(ex, out);
            byte[] body = data == null ? new byte[0] : data.getAsBytes();
            ex.getResponseHeaders().add("X-Djl-Status-Message", String.valueOf(out.getMessage()));
            ex.sendResponseHeaders(out.getCode(), body.length == 0 ? -1 : body.length);
            if (body.length > 0) {
                try (OutputStream os = ex.getResponseBody()) {
                    os.write(body);
                }
            }
            ex.close();
            return;
        }
        ChunkedBytesSupplier chunks = (ChunkedBytesSupplier) data;
        try {
            // As DJL Serving: status and headers go out with the first chunk.
            byte[] first = chunks.nextChunk(chunkTimeoutS, TimeUnit.SECONDS);
            copyHeaders(ex, out);
            ex.getResponseHeaders().add("X-Djl-Status-Message", String.valueOf(out.getMessage()));
            ex.sendResponseHeaders(out.getCode(), 0);
            try (OutputStream os = ex.getResponseBody()) {
                writeChunk(os, first);
                while (chunks.hasNext()) {
                    writeChunk(os, chunks.nextChunk(chunkTimeoutS, TimeUnit.SECONDS));
                }
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } finally {
            ex.close();
        }
    }

    private static void writeChunk(OutputStream os, byte[] chunk) throws IOException {
        if (chunk != null && chunk.length > 0) {
            os.write(chunk);
            os.flush();
        }
    }

    private static void copyHeaders(HttpExchange ex, Output out) {
        for (Map.Entry<String, String> p : out.getProperties().entrySet()) {
            ex.getResponseHeaders().set(p.getKey(), p.getValue());
        }
    }

    private static void send(HttpExchange ex, int code, String body) throws IOException {
        byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
        ex.getResponseHeaders().set("Content-Type", "application/json");
        ex.sendResponseHeaders(code, bytes.length);
        try (OutputStream os = ex.getResponseBody()) {
            os.write(bytes);
        }
        ex.close();
    }
}
