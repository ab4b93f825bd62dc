/*
 * Test-only probe of DJL's own NDList codec (ai.djl:api), for tests/unit/test_io_ndlist_java.py.
 *
 * Decodes the NDList file args[0] (written by djl_handlers.io.ndlist) with NDList.decode, prints one
 * line per array ("DATATYPE shape BYTE_ORDER hex-of-data"), writes DJL's re-encoding of it to
 * args[1], and writes arrays DJL builds itself to args[2] (NDList format: a big-endian INT32 with
 * a name, a FLOAT64 scalar, a BOOLEAN vector), args[3] (the same as NPZ) and args[4] (SAFETENSORS).
 * No engine is needed: PassthroughNDManager only holds buffers.
 *
 * Run with Java 17's single-file launcher:
 *   java -cp 'lib/*' NdlistProbe.java IN OUT_REENCODED OUT_NDLIST OUT_NPZ OUT_SAFETENSORS
 */

import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDList;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.DataType;
import ai.djl.ndarray.types.Shape;
import ai.djl.util.passthrough.PassthroughNDManager;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Paths;

public final class NdlistProbe {

    private NdlistProbe() {}

    public static void main(String[] args) throws Exception {
        NDManager manager = PassthroughNDManager.INSTANCE;
        NDList decoded = NDList.decode(manager, Files.readAllBytes(Paths.get(args[0])));
        for (NDArray array : decoded) {
            ByteBuffer data = array.toByteBuffer().duplicate();
            StringBuilder hex = new StringBuilder();
            while (data.hasRemaining()) {
                hex.append(String.format("%02x", data.get()));
            }
            System.out.println(
                    array.getDataType() + " " + array.getShape() + " " + array.toByteBuffer().order()
                            + " " + hex);
        }
        Files.write(Paths.get(args[1]), decoded.encode());

        ByteBuffer ints = ByteBuffer.allocate(8).order(ByteOrder.BIG_ENDIAN);
        ints.putInt(7).putInt(-8).rewind();
        NDArray named = manager.create(ints, new Shape(2), DataType.INT32);
        named.setName("logits");
        ByteBuffer scalar = ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN);
        scalar.putDouble(1.5).rewind();
        NDArray one = manager.create(scalar, new Shape(), DataType.FLOAT64);
        ByteBuffer flags = ByteBuffer.wrap(new byte[] {1, 0, 1});
        NDArray bools = manager.create(flags, new Shape(3), DataType.BOOLEAN);
        NDList built = new NDList(named, one, bools);
        Files.write(Paths.get(args[2]), built.encode());
        NDList little = new NDList(one, bools);
        Files.write(Paths.get(args[3]), little.encode(NDList.Encoding.NPZ));
        Files.write(Paths.get(args[4]), little.encode(NDList.Encoding.SAFETENSORS));
    }
}
