// Test vectors for hookline's MSK IAM token (crates/kafka/src/aws), made by Amazon's Java library
// software.amazon.msk:aws-msk-iam-auth. Run by scripts/msk-iam-vectors; see there.
//
//   MskIamVectors vectors       prints the JSON fixture (fixed credentials, regions and times) on stdout
//   MskIamVectors check-library  makes a token through the library's own OAUTHBEARER login callback handler (with
//                                the system clock and the credentials of the system properties aws.*) and checks
//                                that `vectors`' signing path gives the same bytes for its date, expiry and
//                                User-Agent
//
// The library reads the clock itself (AWS4SignedPayloadGenerator: Instant.now() for the expiry, and AWS SDK v2's
// Aws4Signer for the signing time) and has no hook to set it. `vectors` therefore runs the library's own
// AuthenticationRequestParams (host check, region, service scope) through the same AWS SDK presigner with the same
// parameters (GET https://HOST/?Action=kafka-cluster:Connect, signing name kafka-cluster, 15 minutes), with the
// signer's clock fixed, then appends User-Agent after signing and encodes as the library does (base64url, no
// padding); `check-library` proves that path equal to the library's own.
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.time.Clock;
import java.time.Instant;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.ArrayList;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerTokenCallback;
import software.amazon.awssdk.auth.credentials.AwsBasicCredentials;
import software.amazon.awssdk.auth.credentials.AwsCredentials;
import software.amazon.awssdk.auth.credentials.AwsSessionCredentials;
import software.amazon.awssdk.auth.signer.Aws4Signer;
import software.amazon.awssdk.auth.signer.params.Aws4PresignerParams;
import software.amazon.awssdk.http.SdkHttpFullRequest;
import software.amazon.awssdk.http.SdkHttpMethod;
import software.amazon.msk.auth.iam.IAMOAuthBearerLoginCallbackHandler;
import software.amazon.msk.auth.iam.internals.AuthenticationRequestParams;

public class MskIamVectors {
  static final DateTimeFormatter AMZ_DATE = DateTimeFormatter.ofPattern("yyyyMMdd'T'HHmmss'Z'").withZone(ZoneOffset.UTC);

  /** The token for these inputs, by the library's request parameters and the SDK presigner on a fixed clock. */
  static String token(AwsCredentials credentials, String region, Instant now, long expiresSeconds, String userAgent) {
    AuthenticationRequestParams params =
        AuthenticationRequestParams.create(String.format("kafka.%s.amazonaws.com", region), credentials, userAgent);
    // AWS4SignedPayloadGenerator.createRequestForSigning
    SdkHttpFullRequest request = SdkHttpFullRequest.builder()
        .method(SdkHttpMethod.GET)
        .protocol("https")
        .host(params.getHost())
        .appendRawQueryParameter("Action", "kafka-cluster:Connect")
        .build();
    // AWS4SignedPayloadGenerator.createSigningParams, with the clock fixed
    Aws4PresignerParams signing = Aws4PresignerParams.builder()
        .awsCredentials(params.getAwsCredentials())
        .expirationTime(now.plusSeconds(expiresSeconds))
        .signingRegion(params.getRegion())
        .signingName(params.getServiceScope())
        .signingClockOverride(Clock.fixed(now, ZoneOffset.UTC))
        .build();
    SdkHttpFullRequest signed = Aws4Signer.create().presign(request, signing);
    // IAMOAuthBearerLoginCallbackHandler.generateTokenValue
    SdkHttpFullRequest withAgent = signed.toBuilder().appendRawQueryParameter("User-Agent", userAgent).build();
    String url = withAgent.getUri().toString();
    return Base64.getUrlEncoder().withoutPadding().encodeToString(url.getBytes(StandardCharsets.UTF_8));
  }

  static String decode(String token) {
    return new String(Base64.getUrlDecoder().decode(token), StandardCharsets.UTF_8);
  }

  static AwsCredentials credentials(String accessKey, String secretKey, String sessionToken) {
    return sessionToken == null
        ? AwsBasicCredentials.create(accessKey, secretKey)
        : AwsSessionCredentials.create(accessKey, secretKey, sessionToken);
  }

  public static void main(String[] args) throws Exception {
    String mode = args.length > 0 ? args[0] : "";
    if (mode.equals("vectors")) {
      vectors();
    } else if (mode.equals("check-library")) {
      checkLibrary();
    } else {
      System.err.println("usage: MskIamVectors vectors | check-library");
      System.exit(2);
    }
  }

  static void vectors() throws Exception {
    String userAgent = "hookline/test";
    // name, access key id, secret access key, session token (null: long-term keys), region, signing time
    Object[][] cases = {
      {"long-term keys, us-east-1", "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", null, "us-east-1",
        "2024-02-29T23:59:59Z"},
      {"session credentials, us-east-1", "ASIAQEXAMPLEEXAMPLE1", "je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY",
        "IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJHMEUCIQD+example/session+token==", "us-east-1",
        "2025-06-01T12:00:00Z"},
      {"session credentials, eu-west-1", "ASIAQEXAMPLEEXAMPLE2", "Zm9vYmFy+K7MDENG/bPxRfiCY/EXAMPLEKEY+/=",
        "FwoGZXIvYXdzEBYaDHqa0AP1/Example+Session/Token/With=Padding==", "eu-west-1", "2026-12-07T16:30:45Z"},
      {"long-term keys, eu-west-1", "AKIAI44QH8DHBEXAMPLE", "je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY", null, "eu-west-1",
        "2023-01-01T00:00:00Z"},
      {"session credentials, ap-southeast-2", "ASIAQEXAMPLEEXAMPLE3", "abc/def+ghi=jkl", "token with spaces & symbols ~!*()'",
        "ap-southeast-2", "2030-07-04T08:09:10Z"},
    };
    ObjectMapper json = new ObjectMapper();
    ObjectNode root = json.createObjectNode();
    root.put("generator", "scripts/msk-iam-vectors (software.amazon.msk:aws-msk-iam-auth " + libraryVersion() + ")");
    ArrayNode list = root.putArray("vectors");
    for (Object[] c : cases) {
      Instant now = Instant.parse((String) c[5]);
      String token = token(credentials((String) c[1], (String) c[2], (String) c[3]), (String) c[4], now, 900, userAgent);
      ObjectNode v = list.addObject();
      v.put("name", (String) c[0]);
      v.put("access_key_id", (String) c[1]);
      v.put("secret_access_key", (String) c[2]);
      if (c[3] != null) {
        v.put("session_token", (String) c[3]);
      }
      v.put("region", (String) c[4]);
      v.put("signing_time", (String) c[5]);
      v.put("user_agent", userAgent);
      v.put("url", decode(token));
      v.put("token", token);
    }
    System.out.println(json.writerWithDefaultPrettyPrinter().writeValueAsString(root));
  }

  static String libraryVersion() {
    // The jar's manifest has no Implementation-Version: scripts/msk-iam-vectors passes the version it fetched.
    return System.getProperty("hookline.msk.iam.version", "?");
  }

  /** The library's own path, then `token` with the date, expiry and User-Agent read back from its token. */
  static void checkLibrary() throws Exception {
    IAMOAuthBearerLoginCallbackHandler handler = new IAMOAuthBearerLoginCallbackHandler();
    handler.configure(Map.of(), "OAUTHBEARER", List.of());
    OAuthBearerTokenCallback callback = new OAuthBearerTokenCallback();
    handler.handle(new javax.security.auth.callback.Callback[] {callback});
    String libraryToken = callback.token().value();
    String url = decode(libraryToken);
    Map<String, String> query = new LinkedHashMap<>();
    for (String pair : URI.create(url).getRawQuery().split("&")) {
      int eq = pair.indexOf('=');
      query.put(pair.substring(0, eq), java.net.URLDecoder.decode(pair.substring(eq + 1), StandardCharsets.UTF_8));
    }
    Instant date = AMZ_DATE.parse(query.get("X-Amz-Date"), Instant::from);
    long expires = Long.parseLong(query.get("X-Amz-Expires"));
    String ours = token(
        credentials(System.getProperty("aws.accessKeyId"), System.getProperty("aws.secretAccessKey"),
            System.getProperty("aws.sessionToken")),
        System.getProperty("aws.region"), date, expires, query.get("User-Agent"));
    if (!ours.equals(libraryToken)) {
      System.err.println("the library's token differs from the vectors' signing path:\n  library: " + url + "\n  vectors: "
          + decode(ours));
      System.exit(1);
    }
    System.out.println("the library's own token equals the vectors' signing path (signed at " + query.get("X-Amz-Date") + ")");
  }
}
