// A broker-side stand-in for Amazon MSK's IAM check, for scripts/kafka's SASL_SSL listener (OAUTHBEARER): it
// decodes the token (base64url of a SigV4-presigned URL), checks the signature against the secret of the access key
// id in the file the JAAS option credentialsFile names (lines: ACCESS_KEY_ID SECRET_ACCESS_KEY PRINCIPAL), the host,
// region, service, action and expiry, and makes the line's principal the session's (User:PRINCIPAL, as ACLs see it).
// MSK itself also asks IAM whether the principal may kafka-cluster:Connect and which actions it may take; here the
// ACLs of scripts/kafka do that part.
//
// Compiled by scripts/kafka against the broker's own jars; broker option:
//   listener.name.sasl_ssl.oauthbearer.sasl.server.callback.handler.class=MskIamValidator
import java.net.URI;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.time.Instant;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.Base64;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;
import javax.security.auth.callback.Callback;
import javax.security.auth.callback.UnsupportedCallbackException;
import javax.security.auth.login.AppConfigurationEntry;
import org.apache.kafka.common.security.auth.AuthenticateCallbackHandler;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerToken;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallback;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

public class MskIamValidator implements AuthenticateCallbackHandler {
  private static final Logger LOG = LoggerFactory.getLogger(MskIamValidator.class);
  private static final DateTimeFormatter AMZ_DATE = DateTimeFormatter.ofPattern("yyyyMMdd'T'HHmmss'Z'").withZone(ZoneOffset.UTC);
  private static final long CLOCK_SKEW_SECONDS = 300;
  private final Map<String, String[]> users = new HashMap<>();
  private String region;

  @Override
  public void configure(Map<String, ?> configs, String mechanism, List<AppConfigurationEntry> entries) {
    Map<String, ?> options = entries.get(0).getOptions();
    region = (String) options.get("region");
    try {
      for (String line : Files.readAllLines(Path.of((String) options.get("credentialsFile")))) {
        String[] f = line.trim().split("\\s+");
        if (f.length == 3) {
          users.put(f[0], new String[] {f[1], f[2]});
        }
      }
    } catch (Exception e) {
      throw new IllegalArgumentException("MskIamValidator: reading credentialsFile: " + e, e);
    }
  }

  @Override
  public void handle(Callback[] callbacks) throws UnsupportedCallbackException {
    for (Callback callback : callbacks) {
      if (!(callback instanceof OAuthBearerValidatorCallback)) {
        throw new UnsupportedCallbackException(callback);
      }
      OAuthBearerValidatorCallback v = (OAuthBearerValidatorCallback) callback;
      try {
        v.token(validate(v.tokenValue()));
      } catch (Exception e) {
        LOG.warn("MskIamValidator: refused a token: {}", e.getMessage());
        v.error("invalid_token", null, null);
      }
    }
  }

  private static void require(boolean ok, String what) {
    if (!ok) {
      throw new IllegalArgumentException(what);
    }
  }

  /** SigV4's URI encoding: unreserved bytes as they are, every other byte as %XX. */
  private static String encode(String s) {
    StringBuilder out = new StringBuilder();
    for (byte b : s.getBytes(StandardCharsets.UTF_8)) {
      char c = (char) (b & 0xff);
      if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || "-_.~".indexOf(c) >= 0) {
        out.append(c);
      } else {
        out.append(String.format("%%%02X", b & 0xff));
      }
    }
    return out.toString();
  }

  private static byte[] hmac(byte[] key, String data) throws Exception {
    Mac mac = Mac.getInstance("HmacSHA256");
    mac.init(new SecretKeySpec(key, "HmacSHA256"));
    return mac.doFinal(data.getBytes(StandardCharsets.UTF_8));
  }

  private static String sha256(String s) throws Exception {
    return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(s.getBytes(StandardCharsets.UTF_8)));
  }

  private OAuthBearerToken validate(String token) throws Exception {
    String url = new String(Base64.getUrlDecoder().decode(token), StandardCharsets.UTF_8);
    URI uri = URI.create(url);
    require("https".equals(uri.getScheme()), "not an https URL");
    String host = uri.getHost();
    require(("kafka." + region + ".amazonaws.com").equals(host), "host " + host + " is not this cluster's region " + region);
    Map<String, String> q = new TreeMap<>();
    for (String pair : uri.getRawQuery().split("&")) {
      int eq = pair.indexOf('=');
      q.put(URLDecoder.decode(pair.substring(0, eq), StandardCharsets.UTF_8), URLDecoder.decode(pair.substring(eq + 1), StandardCharsets.UTF_8));
    }
    require("kafka-cluster:Connect".equals(q.get("Action")), "Action is not kafka-cluster:Connect");
    require("AWS4-HMAC-SHA256".equals(q.get("X-Amz-Algorithm")), "not AWS4-HMAC-SHA256");
    require("host".equals(q.get("X-Amz-SignedHeaders")), "SignedHeaders is not host");
    String[] scope = q.get("X-Amz-Credential").split("/");
    require(scope.length == 5 && scope[2].equals(region) && scope[3].equals("kafka-cluster") && scope[4].equals("aws4_request"),
        "credential scope " + q.get("X-Amz-Credential"));
    String[] user = users.get(scope[0]);
    require(user != null, "unknown access key id " + scope[0]);
    String amzDate = q.get("X-Amz-Date");
    require(amzDate.startsWith(scope[1]), "X-Amz-Date and the scope's date differ");
    Instant signed = AMZ_DATE.parse(amzDate, Instant::from);
    long expires = Long.parseLong(q.get("X-Amz-Expires"));
    require(expires > 0 && expires <= 900, "X-Amz-Expires " + expires);
    Instant now = Instant.now();
    require(!now.isAfter(signed.plusSeconds(expires)), "expired at " + signed.plusSeconds(expires));
    require(!signed.isAfter(now.plusSeconds(CLOCK_SKEW_SECONDS)), "signed in the future");
    // Everything in the query but the signature and the User-Agent (appended after signing) is signed.
    StringBuilder canonicalQuery = new StringBuilder();
    for (Map.Entry<String, String> e : q.entrySet()) {
      if (e.getKey().equals("X-Amz-Signature") || e.getKey().equals("User-Agent")) {
        continue;
      }
      canonicalQuery.append(canonicalQuery.length() == 0 ? "" : "&").append(encode(e.getKey())).append('=').append(encode(e.getValue()));
    }
    String canonicalRequest = "GET\n/\n" + canonicalQuery + "\nhost:" + host + "\n\nhost\n" + sha256("");
    String stringToSign = "AWS4-HMAC-SHA256\n" + amzDate + "\n" + scope[1] + "/" + region + "/kafka-cluster/aws4_request\n" + sha256(canonicalRequest);
    byte[] key = hmac(("AWS4" + user[0]).getBytes(StandardCharsets.UTF_8), scope[1]);
    for (String part : new String[] {region, "kafka-cluster", "aws4_request"}) {
      key = hmac(key, part);
    }
    String want = HexFormat.of().formatHex(hmac(key, stringToSign));
    require(MessageDigest.isEqual(want.getBytes(StandardCharsets.US_ASCII), q.get("X-Amz-Signature").getBytes(StandardCharsets.US_ASCII)),
        "the signature does not match");
    final String principal = user[1];
    final long lifetimeMs = signed.plusSeconds(expires).toEpochMilli();
    final long startMs = signed.toEpochMilli();
    return new OAuthBearerToken() {
      public String value() { return token; }
      public Set<String> scope() { return Set.of(); }
      public long lifetimeMs() { return lifetimeMs; }
      public String principalName() { return principal; }
      public Long startTimeMs() { return startMs; }
    };
  }

  @Override
  public void close() {}
}
